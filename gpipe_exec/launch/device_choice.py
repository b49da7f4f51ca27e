"""Where the ranks run, as a user names it: the device kinds `--device` and $GPIPE_EXEC_DEVICE take (torch-free)."""

from __future__ import annotations

DEVICE_ENV = "GPIPE_EXEC_DEVICE"
DEFAULT_DEVICE = "auto"  # CUDA where torch sees a GPU, else the CPU (`launch.devices.device_type`)
DEVICE_TYPES = (DEFAULT_DEVICE, "cpu", "cuda")

__all__ = ["DEFAULT_DEVICE", "DEVICE_ENV", "DEVICE_TYPES"]
