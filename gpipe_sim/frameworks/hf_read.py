"""A Hugging Face `config.json` read into a scenario: its model on the base scenario's hardware, pipeline and training."""

from __future__ import annotations

import json

from gpipe_sim.errors import ScenarioError
from gpipe_sim.frameworks.common import Read, scenario_from
from gpipe_sim.model.hf_config import hf_model_fields
from gpipe_sim.scenario.scenario import Scenario

SOURCE = "Hugging Face config.json"


def read_hf(text: str, base: Scenario) -> Read:
    """The base scenario with the config's model (`gpipe_sim.model.hf_config.hf_model_fields`),
    one note for each key not taken as written; ScenarioError (one line) naming what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{SOURCE}: malformed JSON at line {exc.lineno}: {exc.msg}") from None
    try:
        model, notes = hf_model_fields(data, SOURCE)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    return Read(scenario_from({**base.to_dict(), "model": model}, SOURCE), notes)
