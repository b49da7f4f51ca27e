"""`--set KEY=VALUE` on the command line: a what-if without editing the scenario file.

KEY is a dotted scenario field (`pipeline.stages`, `model.d_model`, `hardware.preset`), VALUE a YAML
scalar (`8`, `1f1b`, `2.5e-3`, `80 GB`, `true`) or a flow list/mapping (`[6, 6, 7, 7]`,
`{csv: my.csv}`). Every item is applied at once, as `Scenario.with_updates` applies updates (a preset
switch first), so items that only make sense together (more stages and more layers) can be given
together. Any problem is one line naming the item, raised as ScenarioError (exit status 2).

The items are applied to the file's data before it is validated (`load_scenario(path, items)`,
`parse_scenario_with_overrides(data, items)` in gpipe_sim.scenario.scenario), so they may also mend a
file that is invalid on its own. Used by `gpipe-sim simulate`, `max-model`, `sweep` (on its base)
and `schedule`; `gpipe-exec` adds the same option with `add_set_option(parser)` and
`load_scenario(path, args.set)`.
"""

from __future__ import annotations

import argparse
import re
from typing import Any, Callable, Sequence

from gpipe_sim.errors import ScenarioError, one_line
from gpipe_sim.schema import limits

SECTIONS = ("model", "hardware", "pipeline", "training")  # the scenario's sections (`Scenario`'s fields), in order
MAX_ITEM_CHARS = 4096
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)+$")
_EXPONENT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")  # 1e-3: text to YAML 1.1, a number here

SET_HELP = ("change a scenario field without editing the file, e.g. --set pipeline.stages=8 "
            "--set pipeline.schedule=1f1b (repeatable; VALUE is read as YAML)")


def add_set_option(parser: argparse.ArgumentParser, help: str = SET_HELP) -> None:
    """Add the repeatable `--set KEY=VALUE` option (collected in `args.set`, a list)."""
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=help)


def _shown(item: str) -> str:
    return repr(item if len(item) <= 80 else item[:77] + "...")


def parse_override(item: str) -> tuple[str, Any]:
    """"pipeline.stages=8" -> ("pipeline.stages", 8); ScenarioError naming the item if malformed."""
    where = f"--set {one_line(_shown(item))}"
    if len(item) > MAX_ITEM_CHARS:
        raise ScenarioError(f"{where}: longer than the limit of {MAX_ITEM_CHARS:,} characters")
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ScenarioError(f"{where}: expected KEY=VALUE, e.g. pipeline.stages=8")
    if not _KEY.match(key) or key.split(".", 1)[0] not in SECTIONS:
        from gpipe_sim.schema.field_errors import closest_key

        head, dot, rest = key.partition(".")
        close = closest_key(head, SECTIONS) if dot and _KEY.match(key) else None
        hint = (f"did you mean {close}.{rest}?" if close
                else f"start with one of {', '.join(SECTIONS)}, e.g. pipeline.stages")
        raise ScenarioError(f"{where}: {one_line(key, 100)!r} is not a dotted scenario field ({hint})")
    return key, _value(text.strip(), where)


def _value(text: str, where: str) -> Any:
    if _EXPONENT.match(text):
        return float(text)
    import yaml  # loaded when an item is read, not when the option is added: `--help` reads no YAML

    from gpipe_sim.schema.files import YAML_LOADER

    try:
        value = yaml.load(text, Loader=YAML_LOADER)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ScenarioError(f"{where}: the value is not valid YAML ({one_line(str(problem), 100)})") from None
    except (ValueError, OverflowError, RecursionError, IndexError, KeyError, TypeError, AttributeError):
        raise ScenarioError(f"{where}: the value is not a value YAML can hold") from None
    problem = limits.data_shape(value) if isinstance(value, (dict, list)) else None
    if problem:
        raise ScenarioError(f"{where}: {problem}")
    return value


def parse_overrides(items: Sequence[str] | None) -> dict[str, Any]:
    """Every item as {dotted key: value}, in order (a key given twice keeps the last value)."""
    updates: dict[str, Any] = {}
    for item in items or ():
        key, value = parse_override(item)
        updates.pop(key, None)
        updates[key] = value
    return updates


def blame(message: str, items: Sequence[str], valid_without: Callable[[], bool]) -> str | None:
    """The prefix naming what a validation `message` is about: "--set 'ITEM'" for the (last) item
    whose key the message's field names; or, when the data is valid without the items (asked of
    `valid_without` only then), the only item or "with the --set items"; None: the data's own problem."""
    field = message.split(": ", 1)[0]
    for item in reversed(items):
        key = item.partition("=")[0].strip()
        if field == key or field.startswith(key + ".") or key.startswith(field + "."):
            return f"--set {one_line(_shown(item))}"
    if not valid_without():
        return None
    return f"--set {one_line(_shown(items[0]))}" if len(items) == 1 else "with the --set items"
