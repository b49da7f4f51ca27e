"""The GPipe paper's Tables 1-3 as experiment files: run them and set predictions beside the published figures."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpipe_sim.errors import GpipeError
from gpipe_sim.studies.maxmodel import find_max_model, measure
from gpipe_sim.scenario.scenario import Scenario, load_scenario

PAPER_DIR = Path(__file__).resolve().parents[1] / "scenarios" / "paper"  # package data
GB = {"GB": 1e9, "GiB": 2.0**30}


class PaperError(GpipeError, ValueError):
    """A paper experiment file is malformed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchFit(_Strict):
    """"Batch size was adjusted to fit memory": the largest batch (a multiple of M) up to `max` that fits."""

    max: int = Field(gt=0)


class Published(_Strict):
    """Published figures of one cell (sizes in the table's `memory_unit`)."""

    size: int | None = None
    params: float | None = None
    param_memory: float | None = None
    peak_activation: float | None = None
    throughput: float | None = None


class Cell(_Strict):
    name: str
    set: dict[str, Any] = Field(default_factory=dict)
    published: Published
    grow: str | None = None
    step: int | None = None


class Group(_Strict):
    """One network of one table: a ready scenario file and the cells that vary it."""

    name: str
    base: str
    memory_unit: Literal["GB", "GiB"] = "GB"
    normalize_to: str | None = None  # a cell name (throughput tables)
    batch: BatchFit | None = None
    cells: list[Cell]


class Experiment(_Strict):
    table: str
    title: str
    kind: Literal["largest-model", "throughput"]
    groups: list[Group]
    notes: str = ""


@dataclass
class Row:
    """One published figure beside its prediction."""

    table: str
    group: str
    cell: str
    quantity: str
    published: float | None
    predicted: float | None
    step: int | None = None
    detail: str = ""

    @property
    def ratio(self) -> float | None:
        if self.published in (None, 0) or self.predicted is None:
            return None
        return self.predicted / self.published


def load_experiment(path: Path) -> Experiment:
    try:
        data = yaml.safe_load(path.read_text())
        return Experiment.model_validate(data)
    except OSError as exc:
        raise PaperError(f"cannot read {str(path)!r}: {exc.strerror}") from None
    except yaml.YAMLError:
        raise PaperError(f"malformed YAML in {str(path)!r}") from None
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise PaperError(f"{path.name}: {where}: {err.get('msg')}") from None


def _fit_batch(scenario: Scenario, fit: BatchFit) -> Scenario:
    """The scenario with the largest batch (a multiple of its M, at most `fit.max`) that fits."""
    m = scenario.pipeline.micro_batches
    found = find_max_model(scenario, "pipeline.batch_size", step=m, start=m, limit=fit.max)
    if found.best is None or found.best.scenario is None:
        return scenario.with_updates({"pipeline.batch_size": m})
    return found.best.scenario


def run_throughput(group: Group, table: str, base_dir: Path) -> list[Row]:
    from gpipe_sim.api import simulate

    base = load_scenario(base_dir / group.base)
    results: dict[str, tuple[float, Scenario, bool]] = {}
    for cell in group.cells:
        scenario = base.with_updates(cell.set)
        if group.batch is not None:
            scenario = _fit_batch(scenario, group.batch)
        result = simulate(scenario)
        results[cell.name] = (result.throughput_samples_per_s, scenario, result.fits_in_memory)
    ref = results[group.normalize_to or group.cells[0].name][0]
    rows = []
    for cell in group.cells:
        throughput, scenario, fits = results[cell.name]
        p = scenario.pipeline
        detail = f"batch {p.batch_size}, micro-batch {p.batch_size // p.micro_batches}"
        if not fits:
            detail += ", does not fit"
        rows.append(Row(table, group.name, cell.name, "normalized throughput",
                        cell.published.throughput, throughput / ref, detail=detail))
    return rows


def run_largest(group: Group, table: str, base_dir: Path) -> list[Row]:
    base = load_scenario(base_dir / group.base)
    unit = GB[group.memory_unit]
    rows = []
    for cell in group.cells:
        scenario = base.with_updates(cell.set)
        if cell.grow is None:
            raise PaperError(f"{group.name} / {cell.name}: a largest-model cell needs `grow`")
        found = find_max_model(scenario, cell.grow, step=cell.step)
        pub = cell.published
        best = found.best
        at_published = measure(scenario, pub.size, found.field) if pub.size is not None else None
        size_detail = f"grow {found.field}, step {found.step}"
        if best is None:
            size_detail += "; nothing fits"
        rows.append(Row(table, group.name, cell.name, f"largest {found.field.split('.')[-1]}",
                        pub.size, found.largest, step=found.step, detail=size_detail))
        if at_published is not None:  # figures of the published size, as the paper reports them
            rows.append(Row(table, group.name, cell.name, "parameters (M)", _m(pub.params),
                            at_published.params / 1e6, detail=f"at the published size {pub.size}"))
            rows.append(Row(table, group.name, cell.name, f"parameter memory ({group.memory_unit})",
                            pub.param_memory, at_published.param_memory_bytes / unit))
            rows.append(Row(table, group.name, cell.name, f"peak activation memory ({group.memory_unit})",
                            pub.peak_activation, at_published.peak_activation_bytes / unit))
    return rows


def _m(value: float | None) -> float | None:
    return None if value is None else value / 1e6


def run_paper(directory: Path = PAPER_DIR, only: list[str] | None = None) -> list[tuple[Experiment, list[Row]]]:
    """Run every table file (`table*.yaml`) in `directory`, in name order."""
    out = []
    files = sorted(directory.glob("table*.yaml"))
    if not files:
        raise PaperError(f"no table*.yaml experiment files in {str(directory)!r}")
    for path in files:
        exp = load_experiment(path)
        if only and exp.table not in only:
            continue
        rows: list[Row] = []
        for group in exp.groups:
            runner = run_largest if exp.kind == "largest-model" else run_throughput
            rows.extend(runner(group, exp.table, path.parent))
        out.append((exp, rows))
    return out


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100 or float(value).is_integer():
        return f"{value:,.0f}" if abs(value) >= 100 or value == int(value) else f"{value:.3g}"
    return f"{value:.3g}"


def paper_text(tables: list[tuple[Experiment, list[Row]]], markdown: bool = False) -> str:
    """Published and predicted figures side by side with their ratio, one table per paper table."""
    buf = io.StringIO()
    for exp, rows in tables:
        buf.write(f"\n{'### ' if markdown else ''}Table {exp.table}: {exp.title}\n\n")
        header = ["network", "cell", "quantity", "published", "predicted", "ratio", "note"]
        lines = [header]
        for r in rows:
            ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
            note = r.detail
            if r.step is not None and r.published is not None and r.predicted is not None:
                steps = (r.predicted - r.published) / r.step
                note = f"{note}; {steps:+.1f} steps" if note else f"{steps:+.1f} steps"
            lines.append([r.group, r.cell, r.quantity, _fmt(r.published), _fmt(r.predicted), ratio, note])
        if markdown:
            buf.write("| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n")
            for line in lines[1:]:
                buf.write("| " + " | ".join(line) + " |\n")
        else:
            widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
            for line in lines:
                buf.write("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() + "\n")
        if exp.notes:
            buf.write(f"\n{exp.notes.strip()}\n")
    return buf.getvalue().strip("\n")
