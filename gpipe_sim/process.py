"""The `gpipe-sim` process around its command: one BLAS thread unless asked for more, no collection at exit."""

from __future__ import annotations

import gc
import os
import sys
from typing import Callable, Mapping, NoReturn

# NumPy's OpenBLAS starts a thread per core when NumPy loads, and each spins for a while before it
# sleeps: about 0.1 s of CPU a process on a 2-core machine, taken from the command itself when the
# cores are busy. The simulator's array work is element-wise and its matrix products small, which
# OpenBLAS runs on the calling thread at any thread count; a user's own setting is kept.
BLAS_DEFAULTS: Mapping[str, str] = {"OPENBLAS_NUM_THREADS": "1"}

_ADDED: set[str] = set()  # the BLAS_DEFAULTS this process put into its environment


def run_program(main: Callable[[], int]) -> NoReturn:
    """Run `main`, a command line's entry point, as this process's program and exit with its status.

    Before it, `BLAS_DEFAULTS` where the environment sets none (NumPy reads them when it loads, so
    this must run before anything imports NumPy). After it, every object the process still holds is
    frozen out of garbage collection (`gc.freeze`): the interpreter's shutdown then skips tracing the
    loaded modules' tens of thousands of objects (about 40 ms of a 0.3 s simulate) only to find them
    reachable. Exit handlers, stream flushing and module teardown run as always."""
    for name, value in BLAS_DEFAULTS.items():
        if name not in os.environ:
            os.environ[name] = value
            _ADDED.add(name)
    try:
        status: object = main()
    except SystemExit as done:  # argparse ends `--help` and a usage error so
        status = done.code
    gc.freeze()
    sys.exit(status)


def launch_environment() -> dict[str, str]:
    """This process's environment as it was launched (without the defaults `run_program` added):
    what a child timed beside another checkout should see, so that each side sets its own."""
    return {name: value for name, value in os.environ.items() if name not in _ADDED}
