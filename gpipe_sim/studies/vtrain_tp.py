"""Accuracy study of tensor parallelism: the A100 preset against vTrain's Megatron-DeepSpeed iterations
with T = 2, 4, 8 (python -m gpipe_sim.studies.vtrain_tp)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

from gpipe_sim.api import simulate
from gpipe_sim.scenario.scenario import Scenario
from gpipe_sim.reference import VTRAIN_TP_CSV
from gpipe_sim.studies.vtrain import (VOCAB, Row, _print, accuracy, predict, read_csv_rows, read_rows,
                                      scenario_data)

CALIBRATION_TP_CSV = VTRAIN_TP_CSV


def read_tp_rows(path: Path = CALIBRATION_TP_CSV) -> list[Row]:
    """The CSV's rows with tensor parallelism (T > 1)."""
    return [row for row in read_csv_rows(path) if row.tp > 1]


def tp_scenario_data(row: Row, vocab: int = VOCAB) -> dict[str, Any]:
    """Issue 27's scenario for a row: issue 24's with pipeline.tensor_parallel = the row's T."""
    data = scenario_data(row, vocab=vocab)
    data["pipeline"]["tensor_parallel"] = row.tp
    return data


def predict_tp(row: Row, gpu: dict[str, Any] | None = None) -> float:
    """Predicted step seconds of a row; `gpu`: kernel-table fields replacing the preset's."""
    data = tp_scenario_data(row)
    if gpu:
        data["hardware"]["accelerator"] = {"gpu": dict(gpu)}
    return simulate(Scenario.model_validate(data)).step_time_s


def tp_study(path: Path = CALIBRATION_TP_CSV, gpu: dict[str, Any] | None = None,
             by_tp: bool = True) -> dict[str, Any]:
    """The accuracy figures of every T > 1 row of `path` (and of each T's rows alone)."""
    rows = read_tp_rows(path)
    predicted = [predict_tp(r, gpu) for r in rows]
    out: dict[str, Any] = {"all": accuracy(rows, predicted)}
    # the ranking a planner makes: T = 1 and T > 1 together in each (model, GPUs, global batch) group
    same = [r for r in read_rows(path.parent / "calibration.csv")
            if (r.hidden, r.layers) in {(t.hidden, t.layers) for t in rows}] if (path.parent / "calibration.csv").exists() else []
    if same:
        out["with T=1 rows"] = accuracy([*rows, *same], [*predicted, *(predict(r) for r in same)])
    if by_tp:
        for tp in sorted({r.tp for r in rows}):
            idx = [i for i, r in enumerate(rows) if r.tp == tp]
            errors = [abs(predicted[i] / rows[i].measured_s - 1) for i in idx]
            ratios = [predicted[i] / rows[i].measured_s for i in idx]
            out[f"T={tp}"] = {"rows": len(idx), "median_error": statistics.median(errors),
                              "median_ratio": statistics.median(ratios)}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpipe_sim.studies.vtrain_tp", description=__doc__)
    parser.add_argument("--csv", type=Path, default=CALIBRATION_TP_CSV,
                        help="vTrain rows with tensor parallelism (default: the calibration half)")
    parser.add_argument("--collective-efficiency", type=float, default=None,
                        help="what-if: the TP collectives' share of the link (default: the preset's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    gpu = None if args.collective_efficiency is None else {"collective_efficiency": args.collective_efficiency}
    out = tp_study(args.csv, gpu)
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0
    for title, figures in out.items():
        _print(title, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
