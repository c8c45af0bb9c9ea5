"""Freed memory: kept for reuse within a stage (no page faults), given back to the OS between stages (glibc)."""

import os
import subprocess
import sys

import pytest
import torch

from lmprefs.runtime.memory import release_freed_memory


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; malloc_trim is glibc's")
def test_freed_heap_pages_return_to_the_os():
    """Tensors of a few MB come from the heap once malloc's mmap threshold has risen past them; freed, their pages
    stay in the process until trimmed."""
    big = torch.empty(16 * 2**20 // 4)  # 16 MB through mmap: freeing it raises the threshold to 16 MB
    del big
    parts = [torch.ones(2 * 2**20 // 4) for _ in range(100)]  # 200 MB of 2 MB blocks, now from the heap
    held = parts[-1]  # the heap's top stays in use: only trimming returns the pages below it
    del parts
    before = _rss_mib()
    assert release_freed_memory()
    assert _rss_mib() < before - 100, (before, _rss_mib())
    assert held.sum().item() == held.numel()


FAULTS = """
import resource, sys, torch
from lmprefs.runtime.memory import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
def step():  # a forward's temporaries: tensors of a few to tens of MB, alive together, then freed
    xs = [torch.ones(n * 2**20 // 4) for n in (60, 12, 24, 6)]
    return sum(float(x[-1]) for x in xs)
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, env: dict | None = None) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})}).stdout.split()  # fmt: skip
    return out[0], int(out[1])


@pytest.fixture(scope="module")
def kept_faults() -> tuple[str, int]:
    """The faults of a process that keeps freed memory, for both tests below."""
    return _faults("keep")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_blocks_are_reused_without_page_faults(kept_faults):
    """By default a block past glibc's largest mmap threshold (32 MiB) is mapped anew at every allocation and its
    pages faulted in again; kept in the heap, the next steps reuse them. Each run in a process of its own: the
    settings are the process's. Compared with each other, not with a page count: with transparent huge pages on,
    a fault brings in 2 MB."""
    kept, faults = kept_faults
    assert kept == "True"
    _, plain = _faults("plain")
    assert 4 * faults < plain, (faults, plain)  # twenty steps: the 60 MB block faulted in twice at most, not ~20 times


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_thresholds_the_user_set_are_left_alone(kept_faults):
    _, keep = kept_faults
    kept, faults = _faults("keep", {"MALLOC_MMAP_THRESHOLD_": str(2**20)})
    assert kept == "False" and faults > 4 * keep, (faults, keep)
