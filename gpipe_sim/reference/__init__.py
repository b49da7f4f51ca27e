"""The measured data behind the accuracy figures, shipped with the package (sources and licences: README.md here)."""

from __future__ import annotations

from pathlib import Path

REFERENCE_DIR = Path(__file__).resolve().parent
VTRAIN_CSV = REFERENCE_DIR / "vtrain-a100" / "calibration.csv"  # vTrain's A100 rows without tensor parallelism
VTRAIN_TP_CSV = REFERENCE_DIR / "vtrain-a100" / "calibration_tp.csv"  # ... and with it
H100_DIR = REFERENCE_DIR / "h100"  # one H100 SXM's microbenchmarks (*.jsonl)
