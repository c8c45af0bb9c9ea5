#!/usr/bin/env python
"""Two GPU micro-benchmarks behind choices in lmprefs (CUDA only; triton.testing.do_bench, median):

- the decode step's attention (batch 512, 12 heads, 88 cached positions, head dim 64, bf16) under each SDPA
  backend and in lmprefs' own forms compiled (`lmprefs.models.attention.decode_attention`, which a compiled decode
  step takes on a GPU, and the matmul form `grouped_attention`), beside the floor that reading its keys and values
  sets at 3 TB/s;
- the LM head's matmul with GPT-2's 50257 rows against 50304 (a multiple of 64, as lmprefs.models.trunk.lm_logits pads
  it on CUDA) at the decode (512), response (512 x 24) and whole-sequence (512 x 88) row counts, and the fp32 head
  under bf16 autocast plain and padded, forward and forward + backward.

    python benchmarks/gpu_kernels.py

Without CUDA (or without triton) it says so in one line and exits 2, as gpu_throughput.py --device cuda does.
"""

from __future__ import annotations

import importlib.util
import sys

from _common import ArgumentParser


def attention(dev: str = "cuda") -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    B, H, L, D = 512, 12, 88, 64
    q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, H, L, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    mask = torch.ones(B, 1, 1, L, device=dev, dtype=torch.bool)
    mask[..., 70:] = False  # slots not yet written
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    backends = [("cudnn", SDPBackend.CUDNN_ATTENTION, mask), ("efficient", SDPBackend.EFFICIENT_ATTENTION, mask),
                ("math", SDPBackend.MATH, mask), ("flash (no mask)", SDPBackend.FLASH_ATTENTION, None)]  # fmt: skip
    for name, backend, m in backends:
        try:
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
                t = do_bench(lambda m=m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), warmup=25, rep=200,
                             return_mode="median")  # fmt: skip
        except RuntimeError as e:
            print(f"decode attention {name:16s} failed: {str(e)[:100]}")
            continue
        err = ((out.float() - ref).norm() / ref.norm()).item() if m is not None else float("nan")
        print(f"decode attention {name:16s} {t * 1000:8.1f} us   relative error {err:.2e}")
    from lmprefs.models.attention import decode_attention, grouped_attention

    for name, fn in (("lmprefs fused", decode_attention), ("lmprefs matmul", grouped_attention)):
        step = torch.compile(lambda q, k, v, m, fn=fn: fn(q, k, v, m, D**-0.5), dynamic=False)
        out = step(q, k, v, mask).transpose(1, 2)  # [B, H, 1, D] as SDPA's
        t = do_bench(lambda step=step: step(q, k, v, mask), warmup=25, rep=200, return_mode="median")
        err = ((out.float() - ref).norm() / ref.norm()).item()
        print(f"decode attention {name + ' (compiled)':16s} {t * 1000:8.1f} us   relative error {err:.2e}")
    kv_bytes = 2 * k.numel() * k.element_size()
    print(f"decode attention floor: keys + values {kv_bytes / 1e6:.0f} MB, {kv_bytes / 3e12 * 1e6:.1f} us at 3 TB/s")


def lm_head(dev: str = "cuda") -> None:
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    V, d = 50257, 768
    for N in (512, 512 * 24, 512 * 88):
        h = torch.randn(N, d, device=dev, dtype=torch.bfloat16)
        for rows in (V, 50304):
            W = torch.randn(rows, d, device=dev, dtype=torch.bfloat16)
            t = do_bench(lambda W=W, h=h: F.linear(h, W), warmup=25, rep=200, return_mode="median")
            print(f"LM head {N:6d} x {d} x {rows}: {t * 1000:8.1f} us  {2 * N * d * rows / t / 1e9:6.1f} TFLOP/s")
        W32 = torch.randn(V, d, device=dev, requires_grad=True)
        grad = torch.randn(N, V, device=dev, dtype=torch.bfloat16)

        def plain(h=h, W32=W32):
            with torch.autocast("cuda", torch.bfloat16):
                return F.linear(h, W32)

        def padded(h=h, W32=W32):
            with torch.autocast("cuda", torch.bfloat16):
                return F.linear(h, F.pad(W32.to(torch.bfloat16), (0, 0, 0, 50304 - V)))[:, :V]

        for name, fn in (("plain", plain), ("padded", padded)):
            t = do_bench(fn, warmup=25, rep=200, return_mode="median")
            tb = do_bench(lambda fn=fn, g=grad: fn().backward(g), warmup=10, rep=100, return_mode="median",
                          grad_to_none=[W32])  # fmt: skip
            print(f"  fp32 head under bf16 autocast, {name:6s}: forward {t * 1000:8.1f} us, "
                  f"forward + backward {tb * 1000:8.1f} us")


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__.split("\n")[0])
    p.parse_args(argv)
    import torch

    missing = None
    if not torch.cuda.is_available():
        missing = f"CUDA, which torch {torch.__version__} does not see here"
    elif importlib.util.find_spec("triton") is None:
        missing = "triton (for triton.testing.do_bench), which is not installed"
    if missing:
        print(f"{p.prog}: needs {missing}; nothing measured", file=sys.stderr)
        return 2
    print(torch.cuda.get_device_name(0), torch.__version__)
    attention()
    lm_head()
    return 0


if __name__ == "__main__":
    sys.exit(main())
