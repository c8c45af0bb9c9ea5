#!/usr/bin/env python
"""Best-of-N sampling with one prefill per query: `sample(q, repeats=N)` against `sample(q.repeat_interleave(N))`.

What is measured
  A labeling question (best of 4) and an evaluation with several samples per query sample one query several times.
  `repeats=N` runs each query through the model once and copies its keys and values N times; the plain way runs
  the N copies of the query. Both draw the same tokens up to float rounding (tests/models/test_sampling.py):
  a near-tie in one draw can flip a token, and the rest of that row then differs, so the script counts identical
  rows. The two are timed interleaved (plain, shared, shared, plain, ...) so that other load on the machine falls on
  both alike; the median of --reps calls each (the first call of each dropped as warm-up), and their ratio.

  Default shapes: the summarization demo's labeling batch (`lmprefs quickstart --preset summarize`): 16 questions x
  4 samples, queries of 76 tokens (a 64-token article lead between its prefix and suffix), 32-token summaries,
  temperature 0.5, SmolLM2-135M (`lmprefs assets prepare smollm2-135m`); `--model tiny-gpt2 --query-len 16` for a
  quick check (its context is 64 positions).

    python benchmarks/best_of_n_sampling.py [--model smollm2-135m] [--questions 16] [--n 4] [--query-len 76]
        [--response-len 32] [--reps 4] [--threads 2] [--dtype float32|bfloat16] [--device cpu|cuda] [--json FILE]
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import torch
from _common import ArgumentParser, cpu_name, nonnegative_int, positive_int, run_main, source_fingerprint

from lmprefs.errors import UserError
from lmprefs.models.loading import load_lm, max_positions
from lmprefs.models.sampling import sample

# lmprefs internals this script uses, all in this block
from lmprefs.runtime.device import autocast, pick_device


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="an lmprefs model asset or a local HF directory")
    p.add_argument("--questions", type=positive_int, default=16, help="distinct queries per call")
    p.add_argument("--n", type=positive_int, default=4, help="samples per query")
    p.add_argument("--query-len", type=positive_int, default=76)
    p.add_argument("--response-len", type=positive_int, default=32)
    p.add_argument("--reps", type=positive_int, default=4, help="timed calls per way (after one warm-up call each)")
    p.add_argument("--threads", type=nonnegative_int, default=0, help="CPU threads (0: torch's default)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="autocast dtype")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--json", default=None, help="also write the figures here as one JSON object")
    a = p.parse_args(argv)
    if not re.fullmatch(r"cpu|cuda(:\d+)?", a.device):
        p.error(f"--device {a.device!r}: choose cpu, cuda or cuda:N")
    if a.threads:
        torch.set_num_threads(a.threads)

    device = pick_device(a.device, "--device")  # no CUDA: lmprefs' one-line error
    model, tok = load_lm(a.model, device)
    model.eval()
    if a.query_len + a.response_len > max_positions(model):
        raise UserError(f"--query-len {a.query_len} + --response-len {a.response_len} = "
                        f"{a.query_len + a.response_len} tokens: {a.model} has {max_positions(model)} positions; "
                        "ask for fewer (e.g. --query-len 16)")  # fmt: skip
    g = torch.Generator().manual_seed(0)
    q = torch.randint(100, min(len(tok), 20000), (a.questions, a.query_len), generator=g).to(device)
    dtype = getattr(torch, a.dtype)

    def call(shared: bool) -> tuple[float, torch.Tensor]:
        gen = torch.Generator(device=device).manual_seed(1)
        if device.type == "cuda":
            torch.cuda.synchronize()
        s = time.perf_counter()
        with autocast(device, dtype):
            if shared:
                r, _ = sample(model, q, a.response_len, 0.5, len(tok), gen, repeats=a.n)
            else:
                r, _ = sample(model, q.repeat_interleave(a.n, 0), a.response_len, 0.5, len(tok), gen)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - s, r

    times: dict[bool, list[float]] = {False: [], True: []}
    same = rows = 0
    for i in range(a.reps + 1):
        order = (False, True) if i % 2 == 0 else (True, False)
        out = {}
        for shared in order:
            t, out[shared] = call(shared)
            if i > 0:
                times[shared].append(t)
        same += int((out[True] == out[False]).all(1).sum())
        rows += len(out[True])
    plain, shared_prefill = statistics.median(times[False]), statistics.median(times[True])
    print(f"machine: {cpu_name()}, {torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}; "
          f"torch {torch.__version__}; lmprefs sources {source_fingerprint()['sha1']}")
    print(f"{a.model} on {a.device}, autocast {a.dtype}: {a.questions} queries x {a.n} samples, query {a.query_len} "
          f"tokens, response {a.response_len}; median of {a.reps} calls each")
    print(f"  queries repeated ({a.questions * a.n} prefills): {plain:.2f} s")
    print(f"  repeats={a.n} (one prefill per query):  {shared_prefill:.2f} s  "
          f"({shared_prefill / plain:.2f}x the time)")
    print(f"  identical responses: {same} of {rows} rows (the rest differ from a near-tie draw on)")
    if a.json:
        res = {"model": a.model, "device": a.device, "dtype": a.dtype, "threads": torch.get_num_threads(),
               "questions": a.questions, "n": a.n, "query_len": a.query_len, "response_len": a.response_len,
               "reps": a.reps, "seconds_repeated_queries": plain, "seconds_shared_prefill": shared_prefill,
               "time_ratio": shared_prefill / plain, "identical_rows": same, "rows": rows,
               "seconds_all": {"repeated_queries": times[False], "shared_prefill": times[True]},
               "lmprefs_source": source_fingerprint()["sha1"], "torch": torch.__version__}  # fmt: skip
        Path(a.json).write_text(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
