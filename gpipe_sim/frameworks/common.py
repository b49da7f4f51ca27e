"""What every framework's configuration states about a scenario: devices, batch per replica and
micro-batch, each chunk's layers; and the container for a written or read configuration."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpipe_sim.errors import ScenarioError
from gpipe_sim.model.model import TransformerModel
from gpipe_sim.scenario.scenario import Pipeline, Scenario, parse_scenario


@dataclass
class Written:
    """A configuration as the framework takes it (`text`, ready to paste) and one line for each
    part of the scenario it cannot express (`notes`)."""

    text: str
    notes: list[str] = field(default_factory=list)


@dataclass
class Read:
    """A scenario read from a framework's configuration and one line for each flag or key it
    ignored or could not take as written (`notes`)."""

    scenario: Scenario
    notes: list[str] = field(default_factory=list)




def micro_batch_size(p: Pipeline) -> int | None:
    """Samples per micro-batch (batch / D / M), None where M does not divide the per-replica batch
    (the frameworks run equal micro-batches only)."""
    share = p.batch_size // p.data_parallel
    return share // p.micro_batches if share % p.micro_batches == 0 else None


def chunk_sizes(scenario: Scenario) -> tuple[int, ...]:
    """Layers of each chunk, in chunk order (chunk c on rank c mod K for looped schedules), as the
    scenario's partition resolves them (the compiled plan's)."""
    from gpipe_sim.plan.compile import compile_plan

    return tuple(end - start + 1 for start, end in compile_plan(scenario).layout.chunk_layers)


def transformer(scenario: Scenario, framework: str, notes: list[str]) -> TransformerModel | None:
    """The scenario's transformer, or None with a note: the frameworks' configurations describe a
    GPT-style transformer by its sizes, nothing else."""
    model = scenario.model
    if isinstance(model, TransformerModel):
        return model
    notes.append(f"model: a {model.preset} model is not a transformer {framework} can describe by its sizes; "
                 "its model arguments are left out")
    return None


def scenario_from(data: dict[str, Any], source: str) -> Scenario:
    """Validate scenario data read from a framework's file; ScenarioError names the source."""
    try:
        return parse_scenario(data)
    except ScenarioError as exc:
        raise ScenarioError(f"{source}: the scenario it describes is not valid: {exc}") from None


def whole(source: str, flag: str, value: Any, low: int = 1) -> int:
    """A framework's whole-number setting, else ScenarioError naming it."""
    try:
        number = int(str(value), 10) if not isinstance(value, int) or isinstance(value, bool) else value
    except ValueError:
        raise ScenarioError(f"{source}: {flag}: expected a whole number, got {str(value)[:40]!r}") from None
    if number < low:
        raise ScenarioError(f"{source}: {flag}: must be at least {low}, got {number}")
    return number
