"""Typed scenario field kinds (quantities with units, bounded numbers and counts) and the strict base
model. Every kind refuses NaN, infinity where it means nothing, and magnitudes beyond the limits in
`gpipe_sim.schema.limits`, naming the limit."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from gpipe_sim.schema import limits
from gpipe_sim.schema.limits import count, number
from gpipe_sim.schema.units import parse_quantity

_UNIT = {"bytes": "B", "bandwidth": "B/s", "flops": "FLOP/s", "seconds": "s"}


def _bounded(value: float, unit: str, *, low: float, high: float, low_open: bool = False,
             allow_inf: bool = False, min_positive: float = 0.0) -> float:
    """`value` if it lies in [low, high] (or (low, high]; or is +inf where allowed), else ValueError."""
    if math.isnan(value):
        raise ValueError("NaN is not a number the simulator can use")
    if math.isinf(value):
        if value > 0 and allow_inf:
            return value
        raise ValueError(f"{number(value)} is not allowed here (give a finite value up to {number(high)}{unit})")
    if 0 < value < min_positive:
        raise ValueError(f"{number(value)}{unit} is out of range: give 0 or at least {number(min_positive)}{unit}")
    if value < low or (low_open and value == low):
        relation = "greater than" if low_open else "at least"
        raise ValueError(f"{number(value)}{unit} is out of range: must be {relation} {number(low)}{unit}")
    if value > high:
        extra = " (or inf for unlimited)" if allow_inf else ""
        raise ValueError(f"{number(value)}{unit} exceeds the limit of {number(high)}{unit}{extra}")
    return value


def _quantity(kind: str, *, low: float = 0.0, high: float = limits.MAX_QUANTITY, low_open: bool = False,
              allow_inf: bool = False, min_positive: float = 0.0) -> BeforeValidator:
    unit = " " + _UNIT[kind]

    def check(value: Any) -> float:
        return _bounded(parse_quantity(value, kind), unit, low=low, high=high, low_open=low_open,
                        allow_inf=allow_inf, min_positive=min_positive)

    return BeforeValidator(check)


def _real(*, low: float = 0.0, high: float, low_open: bool = False, unit: str = "",
          min_positive: float = 0.0) -> BeforeValidator:
    """A plain number (no unit) in [low, high]; booleans and text that is not a number refused."""

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"expected a number, got {_type_name(value)}")
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise ValueError(f"cannot read {_short(value)} as a number") from None
        elif isinstance(value, int):
            if abs(value) > 10**300:
                raise ValueError(f"{count(value)} exceeds the limit of {number(high)}{unit}")
            value = float(value)
        return _bounded(value, unit, low=low, high=high, low_open=low_open, min_positive=min_positive)

    return BeforeValidator(check)


def _integer(*, low: int, high: int, what: str) -> BeforeValidator:
    """A whole number in [low, high] (a float with no fraction is accepted)."""
    return BeforeValidator(lambda value: whole_number(value, low=low, high=high, what=what))


def whole_number(value: Any, *, low: int, high: int, what: str = "") -> int:
    """`value` as an int in [low, high]; ValueError naming the limit otherwise."""
    if isinstance(value, bool):
        raise ValueError("expected a whole number, got a boolean")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"expected a whole number, got {number(value)}")
        value = int(value)
    elif isinstance(value, str):
        text = value.strip()
        if len(text) > 40 or not re.fullmatch(r"[+-]?[0-9]+", text):
            raise ValueError(f"expected a whole number, got {_short(value)}")
        value = int(text)
    elif not isinstance(value, int):
        raise ValueError(f"expected a whole number, got {_type_name(value)}")
    if value < low:
        raise ValueError(f"{count(value)} is out of range: must be at least {count(low)}")
    if value > high:
        raise ValueError(f"{count(value)} exceeds the limit of {count(high)}{' ' + what if what else ''}")
    return value


def _type_name(value: Any) -> str:
    return {dict: "a mapping", list: "a list", tuple: "a list", type(None): "nothing"}.get(
        type(value), type(value).__name__)


def _short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


# Hardware quantities: numbers or text with units ("16 GiB", "900 GB/s", "125 TFLOPS", "5 us").
Bytes = Annotated[float, _quantity("bytes", allow_inf=True)]
PositiveBytes = Annotated[float, _quantity("bytes", low_open=True, allow_inf=True)]
Bandwidth = Annotated[float, _quantity("bandwidth", low=limits.MIN_RATE, allow_inf=True)]
Flops = Annotated[float, _quantity("flops", low=limits.MIN_RATE)]
Seconds = Annotated[float, _quantity("seconds", high=limits.MAX_SECONDS)]
Fraction = Annotated[float, _real(low=limits.MIN_FRACTION, high=1.0)]
DropoutRate = Annotated[float, _real(high=limits.MAX_DROPOUT)]  # 0 (none) up to just below 1

# Model figures: plain non-negative numbers.
Duration = Annotated[float, _real(high=limits.MAX_SECONDS, unit=" s", min_positive=limits.MIN_SECONDS)]
Amount = Annotated[float, _real(high=limits.MAX_QUANTITY)]  # bytes or FLOPs per sample
NonNegative = Amount  # the former name

# Counts.
LayerCount = Annotated[int, _integer(low=1, high=limits.MAX_LAYERS, what="layers")]
Dimension = Annotated[int, _integer(low=1, high=limits.MAX_DIMENSION, what="")]
ExpertCount = Annotated[int, _integer(low=0, high=limits.MAX_EXPERTS, what="experts")]  # 0: none
LayerCountOrNone = Annotated[int, _integer(low=0, high=limits.MAX_LAYERS, what="layers")]  # 0: none
# tokens an expert takes, in multiples of its even share (Megatron-LM's --moe-expert-capacity-factor)
CapacityFactor = Annotated[float, _real(high=limits.MAX_EXPERTS, low_open=True)]
Params = Annotated[int, _integer(low=0, high=limits.MAX_PARAMS, what="parameters per layer")]
Kernels = Annotated[int, _integer(low=0, high=limits.MAX_KERNELS, what="kernels per layer")]
BatchSize = Annotated[int, _integer(low=1, high=limits.MAX_BATCH, what="samples")]
StageCount = Annotated[int, _integer(low=1, high=limits.MAX_STAGES, what="stages")]
ReplicaCount = Annotated[int, _integer(low=1, high=limits.MAX_STAGES, what="replicas")]
DeviceCount = Annotated[int, _integer(low=1, high=limits.MAX_DEVICE_ID + 1, what="devices")]
TensorParallel = Annotated[int, _integer(low=1, high=1024, what="devices per rank")]
ContextParallel = Annotated[int, _integer(low=1, high=1024, what="devices per sequence")]
ChunkCount = Annotated[int, _integer(low=1, high=limits.MAX_CHUNKS, what="chunks per rank")]
MicroBatchCount = Annotated[int, _integer(low=1, high=limits.MAX_PASSES, what="micro-batches")]
PartCount = Annotated[int, _integer(low=1, high=limits.MAX_LAYERS, what="layers")]
DeviceId = Annotated[int, _integer(low=0, high=limits.MAX_DEVICE_ID, what="")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# `hardware.price_per_device_hour`: an amount of any currency per device per hour (2.5).
Price = Annotated[float, _real(high=limits.MAX_QUANTITY)]
