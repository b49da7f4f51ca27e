"""The executor's malloc settings: freed activations are reused instead of page-faulted back in."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = """
import resource, sys, torch
from gpipe_exec.allocator import cache_host_memory
if sys.argv[1] == "cache":
    assert cache_host_memory() and cache_host_memory()  # applied, and idempotent
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
    # By default freed blocks go back to the kernel (mmap'd, or trimmed off the heap) and return
    # as fresh zero-filled pages; cached, the heap keeps them.
    assert default > 1000
    assert cached < 100
