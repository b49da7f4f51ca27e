"""The frameworks on the command line: `--emit FRAMEWORK` for simulate and plan, and `gpipe-sim read`."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import TYPE_CHECKING, Any, Callable

from gpipe_sim.errors import ScenarioError, one_line
from gpipe_sim.frameworks import FRAMEWORKS, READABLE
from gpipe_sim.schema.limits import MAX_FILE_BYTES
from gpipe_sim.scenario.overrides import add_set_option

if TYPE_CHECKING:  # the writers and readers load pydantic's models: imported when a command runs
    from gpipe_sim.frameworks.common import Read, Written
    from gpipe_sim.scenario.scenario import Scenario


# Where each framework's writer and reader live: imported only when a command uses them.
WRITERS = {"megatron": ("gpipe_sim.frameworks.megatron", "write_megatron"),
           "torchtitan": ("gpipe_sim.frameworks.torchtitan", "write_torchtitan"),
           "deepspeed": ("gpipe_sim.frameworks.deepspeed", "write_deepspeed")}
READERS = {"megatron": ("gpipe_sim.frameworks.megatron_read", "read_megatron"),
           "torchtitan": ("gpipe_sim.frameworks.torchtitan_read", "read_torchtitan"),
           "hf": ("gpipe_sim.frameworks.hf_read", "read_hf")}


def _load(where: tuple[str, str]) -> Callable[..., Any]:
    module, name = where
    return getattr(importlib.import_module(module), name)


def writer(framework: str) -> Callable[["Scenario"], "Written"]:
    """The function writing a scenario as `framework`'s configuration (one of FRAMEWORKS)."""
    if framework not in WRITERS:
        raise ScenarioError(f"--emit: unknown framework {framework!r} (choose from {', '.join(FRAMEWORKS)})")
    return _load(WRITERS[framework])


def reader(framework: str) -> Callable[[str, "Scenario"], "Read"]:
    """The function reading `framework`'s configuration text into a scenario (one of READABLE)."""
    if framework not in READERS:
        raise ScenarioError(f"read: cannot read {framework!r} (choose from {', '.join(READABLE)})")
    return _load(READERS[framework])


def write_notes(notes: list[str]) -> None:
    """Each note as one line on stderr, so that stdout holds only what is pasted."""
    for note in notes:
        sys.stderr.write(f"gpipe-sim: note: {one_line(note)}\n")


def emit(framework: str, scenario: "Scenario") -> int:
    """Print the scenario as `framework`'s configuration on stdout, its notes on stderr."""
    written = writer(framework)(scenario)
    sys.stdout.write(written.text + "\n")
    write_notes(written.notes)
    return 0


def add_emit_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--emit", choices=FRAMEWORKS,
                        help=f"print {what} as this framework's launch arguments or file instead of the report "
                             "(what it cannot express: one note each on stderr)")


def _cmd_read(args: argparse.Namespace) -> int:
    from gpipe_sim.scenario.command_scenario import load_command_scenario
    from gpipe_sim.schema.files import read_text_file

    base = load_command_scenario(args.base)
    text = sys.stdin.read(MAX_FILE_BYTES) if args.file == "-" else \
        read_text_file(args.file, ScenarioError, MAX_FILE_BYTES, what=f"the {args.framework} file ")
    read = reader(args.framework)(text, base)
    sys.stdout.write(read.scenario.with_overrides(args.set).to_yaml())
    write_notes(read.notes)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `read` to the gpipe-sim command line."""
    p = subparsers.add_parser(
        "read", help="read Megatron-LM arguments, a torchtitan TOML or a Hugging Face config.json into a "
                     "scenario (printed as YAML)",
        description="Read a Megatron-LM launch line or arguments file, or a torchtitan job TOML, into a scenario "
                    "on the base scenario's hardware (and its model, for torchtitan); or a Hugging Face model's "
                    "config.json (hf) into the base scenario's model. One note on stderr for each flag or key "
                    "ignored.")
    p.add_argument("framework", choices=READABLE)
    p.add_argument("file", help="the arguments or TOML file (- for stdin)")
    p.add_argument("--base", metavar="SCENARIO", help="scenario YAML for what the file does not say "
                                                      "(default: scenarios/default.yaml)")
    add_set_option(p)
    p.set_defaults(func=_cmd_read)
