"""This machine's matmul peak: the GFLOP/s of a square matmul at the dtype and thread count a run computes with, the
yardstick of `benchmarks/roofline.py` (each stage's share of it) and of `lmprefs quickstart --plan` (each stage's
seconds at the share it reached when measured)."""

from __future__ import annotations

import math
import time

import torch


def matmul_peak(device: str, dtype: str, threads: int, size: int, reps: int) -> float:
    """GFLOP/s of the best of `reps` [size, size] @ [size, size] matmuls in `dtype` (a torch dtype's name) on
    `device` at `threads` threads, after one warm-up; on a CPU the best of torch.mm and oneDNN's linear, which ran an
    fp32 matmul faster than torch.mm (MKL) on an AMD EPYC: the floor is what the fastest kernel at hand allows."""
    torch.set_num_threads(threads)
    dev = torch.device(device)
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(size, size, generator=g).to(dev, getattr(torch, dtype)) for _ in range(2))
    c = torch.empty_like(a)  # the output torch.mm writes into; each kernel's first call is its warm-up
    kernels = [lambda: torch.mm(a, b, out=c)]
    if dev.type == "cpu" and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        kernels.append(lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], ""))

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    best = math.inf
    for kernel in kernels:
        kernel()
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            kernel()
            sync()
            best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best / 1e9
