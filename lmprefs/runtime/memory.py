"""Freed memory handed back to the operating system between the stages of a run.

glibc's malloc keeps the heap pages of freed tensors below its mmap threshold (which it raises as large blocks are
freed) for later allocations: after a sampling pass of 256 rows of SmolLM2 on the CPU the process kept about 500 MB
that no tensor used any more, and each stage of the quickstart then started from the previous stage's high-water
mark (docs/results.md). `malloc_trim` returns those pages; the next allocations fault them in again, which costs a
stage boundary a fraction of a second.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows): nothing to trim this way
        return None


def release_freed_memory() -> bool:
    """Return the heap's free pages to the OS where the C library can (glibc); whether it could."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
