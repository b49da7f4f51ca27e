"""Accuracy study: the A100 preset against vTrain's measured Megatron-DeepSpeed iterations, and the
H100 tables against the held-out per-block timings (python -m gpipe_sim.studies.vtrain)."""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from gpipe_sim.api import simulate
from gpipe_sim.reference import H100_DIR, VTRAIN_CSV
from gpipe_sim.scenario.scenario import Scenario

CALIBRATION_CSV = VTRAIN_CSV
BLOCK_JSONL = H100_DIR / "block.jsonl"


@dataclass(frozen=True)
class Row:
    """One measured iteration (vTrain's ground truth)."""

    gpus: int
    global_batch: int
    micro_batch: int
    hidden: int
    heads: int
    layers: int
    seq: int
    tp: int
    dp: int
    pp: int
    measured_s: float

    @property
    def group(self) -> tuple[int, int, int, int]:
        """(hidden, layers, GPUs, global batch): the configurations a user would rank."""
        return self.hidden, self.layers, self.gpus, self.global_batch


def read_csv_rows(path: Path) -> list[Row]:
    """Every row of a vTrain ground-truth CSV (iteration time in seconds)."""
    rows = []
    with open(path) as f:
        for rec in csv.reader(line for line in f if not line.startswith("#")):
            if not rec:
                continue
            g, gb, mb, h, a, L, s, tp, dp, pp, ms = rec
            rows.append(Row(int(g), int(gb), int(mb), int(h), int(a), int(L), int(s), int(tp), int(dp), int(pp),
                            float(ms) / 1e3))
    return rows


def read_rows(path: Path = CALIBRATION_CSV) -> list[Row]:
    """The CSV's rows without tensor parallelism."""
    return [row for row in read_csv_rows(path) if row.tp == 1]


# GPT-2's vocabulary, as issue 24 defines a row. Megatron-LM pads it to a multiple of 128
# (--make-vocab-size-divisible-by, default 128: 50304), which is what its GEMMs run; the transformer
# preset does the same by default (model.vocab_multiple, 128). `--vocab-multiple 1` prices the
# unpadded 50257 (an odd GEMM n, ~0.2 of a GEMM's usual efficiency on an H100).
VOCAB = 50257
def scenario_data(row: Row, hardware: str = "a100-80gb", vocab: int = VOCAB,
                  vocab_multiple: int | None = None) -> dict[str, Any]:
    """The scenario a row stands for (issue 24's definition); `vocab_multiple` None: the preset's."""
    model = {"preset": "transformer", "layers": row.layers, "d_model": row.hidden, "d_ff": 4 * row.hidden,
             "heads": row.heads, "seq_len": row.seq, "vocab": vocab, "dropout": 0.1}
    if vocab_multiple is not None:
        model["vocab_multiple"] = vocab_multiple
    return {
        "model": model,
        "hardware": {"preset": hardware, "devices_per_node": 8},
        "pipeline": {"stages": row.pp, "data_parallel": row.dp,
                     "micro_batches": row.global_batch // (row.dp * row.micro_batch),
                     "batch_size": row.global_batch, "schedule": "1f1b", "remat": "always",
                     "partition": "uniform" if row.layers % row.pp == 0 else "time"},
        # Megatron-DeepSpeed steps Adam with apex's FusedAdam: the GPU presets' default step (fused)
        "training": {"optimizer": "adam", "dtype": "bf16"},
    }


def predict(row: Row, overrides: dict[str, Any] | None = None, vocab: int = VOCAB,
            vocab_multiple: int | None = None) -> float:
    """Predicted step seconds of a row (hardware fields in `overrides` replace the preset's)."""
    data = scenario_data(row, vocab=vocab, vocab_multiple=vocab_multiple)
    for key, value in (overrides or {}).items():
        data["hardware"].setdefault(key, {}).update(value)
    return simulate(Scenario.model_validate(data)).step_time_s


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-a between two orderings (1: same order)."""
    n, score, pairs = len(a), 0, 0
    for i in range(n):
        for j in range(i + 1, n):
            s = (a[i] - a[j]) * (b[i] - b[j])
            pairs += 1
            score += 1 if s > 0 else (-1 if s < 0 else 0)
    return score / pairs if pairs else 1.0


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile, linear between order statistics."""
    v = sorted(values)
    if not v:
        return math.nan
    pos = (len(v) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def accuracy(rows: Sequence[Row], predicted: Sequence[float]) -> dict[str, float]:
    """Median and p90 relative error, median ratio, Kendall tau per group (median, min) and the
    regret of taking the predicted best (median, max)."""
    errors = [abs(p / r.measured_s - 1) for r, p in zip(rows, predicted)]
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.group, []).append(i)
    taus, regrets = [], []
    for idx in groups.values():
        if len(idx) < 2:
            continue
        meas = [rows[i].measured_s for i in idx]
        pred = [predicted[i] for i in idx]
        taus.append(kendall_tau(meas, pred))
        regrets.append(meas[pred.index(min(pred))] / min(meas) - 1)
    return {
        "rows": len(rows), "groups": len(taus),
        "median_error": statistics.median(errors), "p90_error": percentile(errors, 90),
        "median_ratio": statistics.median(p / r.measured_s for r, p in zip(rows, predicted)),
        "tau_median": statistics.median(taus), "tau_min": min(taus),
        "regret_median": statistics.median(regrets), "regret_max": max(regrets),
    }


# The old roofline model: what the presets priced before the kernel tables (for the before figures).
ROOFLINE = {"accelerator": {"gpu": None}}


def vtrain_study(path: Path = CALIBRATION_CSV, overrides: dict[str, Any] | None = None,
                 vocab: int = VOCAB, vocab_multiple: int | None = None) -> dict[str, float]:
    """The accuracy figures of every row of `path`."""
    rows = read_rows(path)
    return accuracy(rows, [predict(r, overrides, vocab, vocab_multiple) for r in rows])


def group_table(path: Path = CALIBRATION_CSV, overrides: dict[str, Any] | None = None,
                vocab: int = VOCAB, vocab_multiple: int | None = None,
                predicted: Sequence[float] | None = None) -> list[dict[str, Any]]:
    """Per (model, GPUs, global batch) group: its Kendall tau and regret, and each row's
    configuration, measured and predicted seconds (measured order), worst regret first.
    `predicted`: the rows' predictions where already made (else simulated here)."""
    rows = read_rows(path)
    if predicted is None:
        predicted = [predict(r, overrides, vocab, vocab_multiple) for r in rows]
    groups: dict[tuple, list[tuple[Row, float]]] = {}
    for r, p in zip(rows, predicted):
        groups.setdefault(r.group, []).append((r, p))
    out = []
    for (hidden, layers, gpus, batch), items in groups.items():
        items.sort(key=lambda item: item[0].measured_s)
        meas, pred = [r.measured_s for r, _ in items], [p for _, p in items]
        out.append({"hidden": hidden, "layers": layers, "gpus": gpus, "global_batch": batch,
                    "tau": kendall_tau(meas, pred), "regret": meas[pred.index(min(pred))] / min(meas) - 1,
                    "rows": [{"pp": r.pp, "dp": r.dp, "micro_batch": r.micro_batch,
                              "micro_batches": r.global_batch // (r.dp * r.micro_batch),
                              "measured_s": r.measured_s, "predicted_s": p} for r, p in items]})
    out.sort(key=lambda g: (-g["regret"], g["tau"]))
    return out


def _print_groups(groups: list[dict[str, Any]]) -> None:
    print("groups (worst regret first; rows in measured order)")
    for g in groups:
        print(f"  hidden {g['hidden']} layers {g['layers']} GPUs {g['gpus']} batch {g['global_batch']}: "
              f"tau {g['tau']:.2f} regret {g['regret']:.1%}")
        for r in g["rows"]:
            print(f"    PP {r['pp']} DP {r['dp']} mb {r['micro_batch']} M {r['micro_batches']}: measured "
                  f"{r['measured_s'] * 1e3:.1f} ms, predicted {r['predicted_s'] * 1e3:.1f} ms "
                  f"({r['predicted_s'] / r['measured_s']:.2f})")


def block_check(path: Path = BLOCK_JSONL, hardware: str = "h100-sxm") -> dict[str, float]:
    """Per-block forward and forward+backward, predicted by the preset's kernel tables against the
    measured pre-LN GPT blocks (flash attention, dropout 0.1): held out, never fitted to."""
    from gpipe_sim.costs.layer_time import layer_seconds
    from gpipe_sim.hardware.hardware import Hardware
    from gpipe_sim.model.layers import build_layers
    from gpipe_sim.model.model import TransformerModel

    accel = Hardware.model_validate({"preset": hardware}).accelerator
    fwd_err, both_err, ratios = [], [], []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") != "block":
            continue
        p = 2 if r["dtype"] in ("bf16", "fp16") else 4
        model = TransformerModel(layers=1, d_model=r["hidden"], d_ff=4 * r["hidden"], heads=r["heads"],
                                 seq_len=r["seq"], attention="flash", dropout=0.1)
        block = build_layers(model, p, accel.dropout_mask_bytes(p))[1]
        f, b = layer_seconds(block, r["micro_batch"], accel, r["dtype"], p)
        fwd_err.append(abs(f / r["fwd_s"] - 1))
        both_err.append(abs((f + b) / r["fwd_bwd_s"] - 1))
        ratios.append((f + b) / r["fwd_bwd_s"])
    return {"blocks": len(fwd_err), "forward_median_error": statistics.median(fwd_err),
            "forward_p90_error": percentile(fwd_err, 90), "fwd_bwd_median_error": statistics.median(both_err),
            "fwd_bwd_p90_error": percentile(both_err, 90), "fwd_bwd_median_ratio": statistics.median(ratios)}


def _print(title: str, figures: dict[str, float]) -> None:
    print(title)
    for key, value in figures.items():
        print(f"  {key:22s} {value:.3f}" if isinstance(value, float) else f"  {key:22s} {value}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpipe_sim.studies.vtrain", description=__doc__)
    parser.add_argument("--csv", type=Path, default=CALIBRATION_CSV, help="vTrain rows (default: the calibration half)")
    parser.add_argument("--blocks", type=Path, default=BLOCK_JSONL, help="H100 block timings (held out)")
    parser.add_argument("--before", action="store_true", help="also the roofline model the presets used before")
    parser.add_argument("--vocab", type=int, default=VOCAB, help="vocabulary (default GPT-2's 50257)")
    parser.add_argument("--vocab-multiple", type=int, default=None,
                        help="pad the vocabulary to a multiple of this (default the preset's 128, as Megatron: "
                             "50257 -> 50304; 1: unpadded)")
    parser.add_argument("--groups", action="store_true",
                        help="also each (model, GPUs, global batch) group's tau, regret and rows")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = read_rows(args.csv)
    predicted = [predict(r, None, args.vocab, args.vocab_multiple) for r in rows]  # once, for both tables
    out: dict[str, Any] = {"vtrain_a100": accuracy(rows, predicted)}
    if args.groups:
        out["vtrain_a100_groups"] = group_table(args.csv, predicted=predicted)
    if args.before:
        out["vtrain_a100_roofline"] = vtrain_study(args.csv, ROOFLINE, args.vocab, args.vocab_multiple)
    if args.blocks.exists():
        out["h100_blocks"] = block_check(args.blocks)
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        for title, figures in out.items():
            if title == "vtrain_a100_groups":
                _print_groups(figures)
            else:
                _print(title, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
