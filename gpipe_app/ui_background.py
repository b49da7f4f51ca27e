"""A long computation run for the app in a background thread: its progress, a cancel, its result."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpipe_sim.errors import GpipeError, first_line

# A job whose page has not asked about it for this long (the tab was closed, or the user went to
# another page) stops at its next progress report instead of keeping a core busy.
ABANDONED_S = 30.0


class Cancelled(Exception):
    """Raised inside the job's progress report once it is cancelled or abandoned."""


@dataclass
class BackgroundJob:
    """`work(progress)` run in a daemon thread for the question `key`. `work` must call
    `progress(done, total)` as it goes: that is where a cancel (or an abandoned page) stops it.
    When it ends, exactly one of `result`, `error` (one line) or `cancelled` is set."""

    key: str
    work: Callable[[Callable[[int, int], None]], Any]
    done: int = 0
    total: int = 0
    result: Any = None
    error: str | None = None
    started: float = field(default_factory=time.monotonic)
    _seen: float = field(default_factory=time.monotonic)
    _cancel: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> "BackgroundJob":
        """Start the thread; return self."""
        self._thread = threading.Thread(target=self._run, name=f"gpipe-app-job-{self.key[:12]}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self.result = self.work(self._progress)
        except Cancelled:
            pass
        except GpipeError as exc:
            self.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - one line on the page, never a traceback
            self.error = f"{type(exc).__name__}: {first_line(exc)}"

    def _progress(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        if self._cancel.is_set() or time.monotonic() - self._seen > ABANDONED_S:
            self._cancel.set()
            raise Cancelled

    @property
    def running(self) -> bool:
        """Whether the thread is still working."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def cancelled(self) -> bool:
        """Whether it was cancelled (or abandoned)."""
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Ask it to stop at its next progress report."""
        self._cancel.set()

    def seen(self) -> None:
        """The page is still watching (call on every poll)."""
        self._seen = time.monotonic()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end (tests); True when it has."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running

    @property
    def fraction(self) -> float:
        """The share of the work reported done, 0..1."""
        return min(1.0, self.done / self.total) if self.total else 0.0
