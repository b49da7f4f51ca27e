"""Device locks: stages that share one device (`hardware.stage_to_device`) compute one at a time."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import ContextManager, Iterator, Sequence

LOCK_DIR_ENV = "GPIPE_EXEC_LOCK_DIR"  # set per launch; unset: stages sharing a device are not serialized


class DeviceLock:
    """An exclusive file lock per device, held around each compute action.

    gpipe_sim's engine serializes the compute of stages mapped to one device (a device runs one
    action at a time, first come first served); this makes the real run do the same instead of
    letting the operating system time-slice the stages' processes on shared cores.
    """

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    @contextmanager
    def hold(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.sched_yield()  # let a stage waiting for the device take it now

    def close(self) -> None:
        os.close(self._fd)


def device_lock(rank: int, device_map: Sequence[int]) -> DeviceLock | None:
    """This rank's device lock if its device runs other stages too and a lock dir is set."""
    lock_dir = os.environ.get(LOCK_DIR_ENV)
    device = device_map[rank]
    if not lock_dir or sum(1 for d in device_map if d == device) < 2:
        return None
    return DeviceLock(Path(lock_dir) / f"device{device}.lock")


def holding(lock: DeviceLock | None) -> ContextManager[None]:
    return nullcontext() if lock is None else lock.hold()
