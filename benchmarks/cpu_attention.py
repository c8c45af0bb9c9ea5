#!/usr/bin/env python
"""Attention on the CPU: transformers' SDPA against lmprefs' attention (`lmprefs.models.attention`) at the shapes
lmprefs runs.

What is measured
  One attention call of one block, as the model's attention interface makes it: transformers'
  `sdpa_attention_forward` (PyTorch's fused CPU kernel; a decode step packs the grouped query heads, longer rows
  repeat the key-value heads) against `lmprefs.models.attention.attention` (the eager form per key-value group for
  short rows, SDPA for the rest), on the same inputs: queries and keys in fp32 as they leave the rotary embedding,
  values in the autocast dtype, a boolean mask with padding. Each shape is timed forward only (sampling, scoring,
  the frozen prefix) or forward and backward (training), under autocast in --dtype. The two are interleaved (one call
  batch of each per round) so other load falls on both alike; the median of --reps rounds, their ratio, and each
  one's largest error against the same attention in fp64.

  Default shapes: SmolLM2-135M's heads (9 query heads over 3 key-value heads of 64): a decode step of the quickstart's
  128-row batches over the 56-slot static cache and over 512 and 1,024 keys; the PPO minibatch (16 rows) and the reward
  model's step (64 rows) of 56 tokens, forward and backward; the scoring forward at 64 and 128 rows; and rows of 128,
  256 and 512 tokens, where the fused kernel takes over (`lmprefs.models.attention.short`).

    python benchmarks/cpu_attention.py [--reps 5] [--threads 1] [--dtype bfloat16|float32] [--json FILE]
        [--shapes B:LQ:LK:fwd|train,...] [--heads 9:3:64]
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import torch
from _common import ArgumentParser, cpu_name, nonnegative_int, positive_int, run_main, source_fingerprint

from lmprefs.models import attention

SHAPES = ("128:1:56:fwd,128:1:512:fwd,128:1:1024:fwd,16:56:56:train,64:56:56:train,64:56:56:fwd,128:56:56:fwd,"
          "16:128:128:train,16:256:256:train,8:512:512:train,16:256:256:fwd")  # fmt: skip


class Block(torch.nn.Module):
    """What the attention functions read of an attention module."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups, self.is_causal, self.layer_idx = groups, True, 0


def parse_shapes(text: str) -> list[tuple[int, int, int, bool]]:
    shapes = []
    for part in text.split(","):
        try:
            b, lq, lk, kind = part.split(":")
            shape = (int(b), int(lq), int(lk), kind)
        except ValueError:
            raise ValueError(f"--shapes {part!r}: expected ROWS:QUERY_LEN:KEY_LEN:fwd|train") from None
        if min(shape[:3]) < 1 or shape[1] > shape[2] or kind not in ("fwd", "train"):
            raise ValueError(f"--shapes {part!r}: positive sizes, QUERY_LEN <= KEY_LEN, fwd or train")
        shapes.append((shape[0], shape[1], shape[2], kind == "train"))
    return shapes


def inputs(rows: int, lq: int, lk: int, heads: tuple[int, int, int], dtype: torch.dtype, grad: bool):
    H, Hkv, D = heads
    g = torch.Generator().manual_seed(0)
    q = torch.randn(rows, H, lq, D, generator=g).requires_grad_(grad)
    k = torch.randn(rows, Hkv, lk, D, generator=g).requires_grad_(grad)
    v = torch.randn(rows, Hkv, lk, D, generator=g).to(dtype).requires_grad_(grad)
    mask = torch.ones(lk, lk, dtype=torch.bool).tril()[lk - lq :].expand(rows, 1, lq, lk).clone()
    mask[::3, :, :, : min(4, lk - lq)] = False  # left padding of every third row
    mask |= torch.eye(lk, dtype=torch.bool)[lk - lq :]  # no row without a key
    return q, k, v, mask


def timed(fn, args, grad: bool, dtype: torch.dtype, calls: int) -> float:
    t = time.perf_counter()
    for _ in range(calls):
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            out = fn(*args)
        if grad:
            out.float().sum().backward()
    return (time.perf_counter() - t) / calls


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=positive_int, default=5, help="interleaved rounds (median)")
    p.add_argument("--threads", type=nonnegative_int, default=1, help="CPU threads (0: torch's default)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"], help="autocast dtype")
    p.add_argument("--shapes", default=SHAPES, help="ROWS:QUERY_LEN:KEY_LEN:fwd|train, comma-separated")
    p.add_argument("--heads", default="9:3:64", help="QUERY_HEADS:KV_HEADS:HEAD_DIM (default SmolLM2-135M's)")
    p.add_argument("--json", default=None, help="also write the figures here as one JSON object")
    a = p.parse_args(argv)
    try:
        H, Hkv, D = (int(x) for x in a.heads.split(":"))
        heads = (H, Hkv, D)
        assert min(heads) > 0 and H % Hkv == 0
    except (ValueError, AssertionError):
        p.error(f"--heads {a.heads!r}: QUERY_HEADS:KV_HEADS:HEAD_DIM, query heads a multiple of key-value heads")
    try:
        shapes = parse_shapes(a.shapes)
    except ValueError as e:
        p.error(str(e))
    if a.threads:
        torch.set_num_threads(a.threads)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    dtype = getattr(torch, a.dtype)
    block = Block(heads[0] // heads[1])
    scale = heads[2] ** -0.5
    ways = {"sdpa": lambda q, k, v, m: sdpa_attention_forward(block, q, k, v, m, scaling=scale)[0],
            "lmprefs": lambda q, k, v, m: attention.attention(block, q, k, v, m, scaling=scale)[0]}  # fmt: skip
    print(f"cpu: {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads, autocast {a.dtype}, "
          f"heads {a.heads}, median of {a.reps} interleaved rounds", flush=True)  # fmt: skip
    rows = []
    for b, lq, lk, grad in shapes:
        args = inputs(b, lq, lk, heads, dtype, grad)
        with torch.no_grad():
            q, k, v, m = (x.double() if x.is_floating_point() else x for x in args)
            G = block.num_key_value_groups
            ref = torch.nn.functional.scaled_dot_product_attention(
                q, k.repeat_interleave(G, 1), v.repeat_interleave(G, 1), attn_mask=m, scale=scale).transpose(1, 2)
            errors = {}
            for name, fn in ways.items():
                with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                    errors[name] = float((fn(*args).double() - ref).abs().max())
        # about 20 ms of work per timed batch of calls
        calls = max(1, int(0.02 / max(1e-5, timed(ways["sdpa"], args, grad, dtype, 1))))
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(a.reps):
            for name, fn in ways.items():
                seconds[name].append(timed(fn, args, grad, dtype, calls))
        med = {name: statistics.median(s) for name, s in seconds.items()}
        row: dict[str, Any] = {"rows": b, "query_len": lq, "key_len": lk,
                               "pass": "forward+backward" if grad else "forward", "eager": attention.short(lq, lk),
                               "ms": {n: 1e3 * s for n, s in med.items()}, "ratio": med["lmprefs"] / med["sdpa"],
                               "max_error": errors}  # fmt: skip
        rows.append(row)
        print(f"{b:4d} rows x {lq:4d} queries x {lk:4d} keys {row['pass']:>16}: sdpa {row['ms']['sdpa']:8.3f} ms, "
              f"lmprefs {row['ms']['lmprefs']:8.3f} ms ({'eager' if row['eager'] else 'sdpa'}), "
              f"ratio {row['ratio']:.3f}; max error vs fp64 {errors['sdpa']:.1e} / {errors['lmprefs']:.1e}",
              flush=True)  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": cpu_name(), "threads": torch.get_num_threads(), "dtype": a.dtype, "heads": heads,
                       "reps": a.reps, "shapes": rows, "source": source_fingerprint()}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
