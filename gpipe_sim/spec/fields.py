"""Typed scenario field kinds (quantities with units, non-negative numbers) and the strict base model."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from gpipe_sim.spec.units import parse_quantity


def _quantity(kind: str) -> BeforeValidator:
    return BeforeValidator(lambda value: parse_quantity(value, kind))


Bytes = Annotated[float, _quantity("bytes"), Field(ge=0)]
PositiveBytes = Annotated[float, _quantity("bytes"), Field(gt=0)]
Bandwidth = Annotated[float, _quantity("bandwidth"), Field(gt=0)]
Flops = Annotated[float, _quantity("flops"), Field(gt=0)]
Seconds = Annotated[float, _quantity("seconds"), Field(ge=0)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
