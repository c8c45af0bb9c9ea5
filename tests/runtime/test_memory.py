"""Freed memory goes back to the OS between stages (glibc's malloc_trim)."""

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
    big = torch.empty(64 * 2**20 // 4)  # 64 MB through mmap: freeing it raises the threshold above 8 MB blocks
    del big
    parts = [torch.ones(2 * 2**20 // 4) for _ in range(100)]  # 200 MB of 2 MB blocks, now from the heap
    held = parts[-1]  # the heap's top stays in use: only trimming returns the pages below it
    del parts
    before = _rss_mib()
    assert release_freed_memory()
    assert _rss_mib() < before - 100, (before, _rss_mib())
    assert held.sum().item() == held.numel()
