"""The validation document (`gpipe-exec validate --json`): a prediction beside its measurement, written and read here."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpipe_sim.results.result import Result


@dataclass
class ValidationDocument:
    """What a validation reports: the predicted and measured Results, the relative error of each
    compared field, the measured step times, the calibration the prediction used (None: the
    preset's), every round's (predicted, measured) step where there were several, and the scenario
    as run (plain data)."""

    predicted: Result
    measured: Result
    relative_error: dict[str, float]
    measured_step_times_s: list[float] = field(default_factory=list)
    link: dict[str, Any] | None = None
    calibration: dict[str, Any] | None = None
    rounds: list[tuple[float, float]] = field(default_factory=list)
    scenario: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)  # what reading a file left out, one line each

    def to_dict(self, timeline: bool = True) -> dict[str, Any]:
        return {
            "predicted": self.predicted.to_dict(timeline),
            "measured": self.measured.to_dict(timeline),
            "relative_error": self.relative_error,
            "measured_step_times_s": self.measured_step_times_s,
            "link": self.link,
            "calibration": self.calibration,
            "rounds": [{"predicted_step_s": p, "measured_step_s": m} for p, m in self.rounds],
            "scenario": self.scenario,
        }

    @classmethod
    def from_json(cls, text: str | bytes) -> "ValidationDocument":
        """Parse a document; ValueError with one line naming the part on anything malformed."""
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object with keys predicted, measured, relative_error")
        halves = {}
        for key in ("predicted", "measured"):
            if not isinstance(data.get(key), dict):
                raise ValueError(f"{key}: missing (expected the output of `gpipe-exec validate --json`)")
            try:
                halves[key] = Result.from_dict(data[key])
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise ValueError(f"{key}: not a result ({type(exc).__name__}: {exc})") from None
        errors = data.get("relative_error") or {}
        if not isinstance(errors, dict):
            raise ValueError("relative_error: expected a mapping from field to number")
        steps = data.get("measured_step_times_s") or []
        rounds, notes = _rounds(data.get("rounds") or [])
        return cls(
            predicted=halves["predicted"],
            measured=halves["measured"],
            relative_error={str(k): float(v) for k, v in errors.items() if _number(v)},
            measured_step_times_s=[float(t) for t in steps if _number(t)] if isinstance(steps, list) else [],
            link=data.get("link") if isinstance(data.get("link"), dict) else None,
            calibration=data.get("calibration") if isinstance(data.get("calibration"), dict) else None,
            rounds=rounds,
            scenario=data.get("scenario") if isinstance(data.get("scenario"), dict) else None,
            notes=notes,
        )


def _rounds(rounds: Any) -> tuple[list[tuple[float, float]], list[str]]:
    """Every round's (predicted, measured) step, or none and a note when one cannot be read."""
    ok = isinstance(rounds, list) and all(
        isinstance(r, dict) and _number(r.get("predicted_step_s")) and _number(r.get("measured_step_s"))
        for r in rounds)
    if not ok:
        return [], ["The file's rounds could not be read; they are left out."]
    return [(float(r["predicted_step_s"]), float(r["measured_step_s"])) for r in rounds], []


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
