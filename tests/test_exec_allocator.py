"""The executor's malloc settings: freed activations are reused instead of page-faulted back in."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = """
import resource, sys, torch
from gpipe_exec.measure.allocator import cache_host_memory
if sys.argv[1] == "cache":
    assert cache_host_memory() and cache_host_memory()  # applied, and idempotent
else:  # glibc's initial threshold, held fixed: what its adaptive one does whenever it falls back
    import ctypes
    assert ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024) == 1  # M_MMAP_THRESHOLD
x = torch.ones(64, 16, 32, 32)  # 4 MiB, like a batch of the convnet's activations
for _ in range(30):
    (x * 2).sum()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(100):
    (x * 2).sum()  # allocates and frees 4 MiB
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_cached_host_memory_stops_page_faults_per_allocation() -> None:
    default, cached = _faults("default"), _faults("cache")
    # Above the threshold each 4 MiB block is mmap'd and comes back as 1024 fresh zero-filled pages;
    # cached, the heap keeps it (a block or two of fresh heap at most, not one per allocation).
    assert default > 100 * 1000
    assert cached < 10 * 1024
