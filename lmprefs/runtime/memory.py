"""How freed tensor memory goes back to the operating system on the CPU: kept for reuse within a stage
(`keep_freed_memory`), handed back between the stages of a run (`release_freed_memory`).

torch's CPU allocator asks malloc for every tensor anew. glibc's malloc serves a block above its mmap threshold (which
it raises as large blocks are freed, to at most 32 MiB) with a fresh mapping and unmaps it when it is freed, and
returns the free top of its heap to the OS once it passes twice that threshold: so the large temporaries of a forward
(logits, activations, a cast of the LM head) arrive as new pages, each zeroed by the kernel on first touch, at every
step. Kept in the heap, they are reused as they are (the page faults and time measured: docs/results.md).

Kept for reuse, the heap's free pages stay in the process: after a sampling pass of 256 rows of SmolLM2 the process
kept about 500 MB that no tensor used any more, and each stage of the quickstart would start from the previous
stage's high-water mark. `malloc_trim` between stages returns those pages; the next allocations fault them in
again, which costs a stage boundary a fraction of a second.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (glibc's malloc.h)

MMAP_THRESHOLD = 64 << 20
"""Blocks from this size up still get a mapping of their own, given back when freed: a sampling call's KV cache
(hundreds of MB, once a call) is not worth keeping after it, a forward's temporaries (up to SmolLM2's LM head cast
to bf16, 57 MB) are."""

TRIM_THRESHOLD = 1 << 30
"""Free memory at the heap's top that malloc keeps before it gives any back."""


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name) if name else None
        return lib if lib is not None and hasattr(lib, "malloc_trim") and hasattr(lib, "mallopt") else None
    except OSError:  # not glibc (musl, macOS, Windows): nothing to tune or trim this way
        return None


def _user_tuned() -> bool:
    """Whether the user set malloc's thresholds for this process (glibc's environment variables or tunables)."""
    return any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")) or (
        "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""))


@functools.cache
def keep_freed_memory() -> bool:
    """Have malloc keep freed blocks below MMAP_THRESHOLD in its heap for the next allocations, instead of handing
    their pages back and faulting new ones in; whether it could (glibc, thresholds not set by the user). Once a
    process: the settings are the process's."""
    lib = _libc()
    if lib is None or _user_tuned():
        return False
    return bool(lib.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(lib.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def release_freed_memory() -> bool:
    """Return the heap's free pages to the OS where the C library can (glibc); whether it could."""
    lib = _libc()
    if lib is None:
        return False
    lib.malloc_trim(0)
    return True


def available_memory() -> int | None:
    """Bytes the kernel could give this process now without swapping (MemAvailable of /proc/meminfo: free memory
    plus the caches it can drop); None where it does not say (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
