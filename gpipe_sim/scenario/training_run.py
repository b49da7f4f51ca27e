"""The whole training run a step is part of: its token budget, the price of a device-hour and the
goodput model (failures and checkpoints), the scenario fields that turn a step into days and cost."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, model_validator

from gpipe_sim.schema import limits
from gpipe_sim.schema.fields import Seconds, _bounded, _real, _Strict
from gpipe_sim.model.model import ModelSpec, TableModel, TransformerModel
from gpipe_sim.schema.units import parse_count


def _token_count(value: Any) -> float:
    return _bounded(parse_count(value), " tokens", low=0.0, low_open=True, high=limits.MAX_QUANTITY)


# `training.tokens`: the tokens to train on, a number or text with K, M, B or T ("15T", "300B").
TokenCount = Annotated[float, BeforeValidator(_token_count)]
DeviceHours = Annotated[float, _real(high=limits.MAX_QUANTITY, low_open=True, unit=" device-hours")]


class Goodput(_Strict):
    """What failures and checkpoints cost a run (gpipe_sim.results.run_cost): each device fails on
    average once every `mtbf_device_hours` hours of running; the run saves a checkpoint every
    `checkpoint_interval_s` seconds of training (default: the interval that maximises goodput),
    stalling `checkpoint_save_s`; a failure costs `restart_s` to restart and reload, plus the work
    since the last checkpoint."""

    mtbf_device_hours: DeviceHours
    checkpoint_save_s: Seconds
    restart_s: Seconds = 0.0
    checkpoint_interval_s: Annotated[float, _real(high=limits.MAX_SECONDS, low_open=True, unit=" s")] | None = None

    @model_validator(mode="after")
    def _interval_exists(self) -> "Goodput":
        if self.checkpoint_interval_s is None and self.checkpoint_save_s == 0:
            raise ValueError("training.goodput.checkpoint_save_s: 0 s makes the best interval 0 (checkpoint "
                             "continuously); give a save time above 0 or a checkpoint_interval_s")
        return self


def tokens_per_sample(model: ModelSpec) -> float | None:
    """Tokens one sample holds: a transformer's sequence length, a layer table's recorded
    `tokens_per_sample`; None for a model without tokens (its rate is samples/s)."""
    if isinstance(model, TransformerModel):
        return model.seq_len
    if isinstance(model, TableModel):
        return model.tokens_per_sample
    return None
