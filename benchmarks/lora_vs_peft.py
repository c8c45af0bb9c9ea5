"""lmprefs' hand-written LoRA (lmprefs.models.lora) against peft's on SmolLM2-135M: the same adapters (rank 8,
alpha 16, q/k/v/o in the top 8 of 30 blocks), one forward + backward of the top blocks only (the frozen prefix
computed once, as lmprefs does in PPO and reward training), batch 32 x 56 tokens, fp32, 2 threads.

    python3 benchmarks/lora_vs_peft.py [--reps 5] [--peft-first]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import get_peft_model

from lmprefs.config import LoraConfig
from lmprefs.models.loading import load_lm, trunk_blocks
from lmprefs.models.lora import add_adapter, using
from lmprefs.models.trunk import _only_blocks, attention_mask, frozen_prefix, model_inputs, trunk_hidden

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions (the median is printed)")
    ap.add_argument("--peft-first", action="store_true", help="time peft first (to see order effects)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    base, tok = load_lm("smollm2-135m")
    n_blocks, top = len(trunk_blocks(base)), 8
    tokens = torch.randint(0, len(tok), (32, 56))

    mine = copy.deepcopy(base)
    add_adapter(mine, LoraConfig(rank=8, alpha=16.0, layers=top, targets=TARGETS), "policy")
    with using(mine, "policy"):
        pre = frozen_prefix(mine, tokens)

    def step_mine() -> None:
        with using(mine, "policy"):
            h = trunk_hidden(mine, tokens, pre)
        h.float().pow(2).mean().backward()

    peft_cfg = PeftLoraConfig(r=8, lora_alpha=16, target_modules=list(TARGETS), lora_dropout=0.0,
                              layers_to_transform=list(range(n_blocks - top, n_blocks)))  # fmt: skip
    inner = get_peft_model(copy.deepcopy(base), peft_cfg).base_model.model  # the causal LM holding peft's layers
    ids, mask, pos = model_inputs(tokens)
    mask = attention_mask(inner, mask)
    with torch.no_grad(), _only_blocks(inner, 0, n_blocks - top, final_norm=False):
        hp = inner.base_model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state

    def step_peft() -> None:
        with _only_blocks(inner, n_blocks - top, None, from_hidden=True):
            out = inner.base_model(inputs_embeds=hp, attention_mask=mask, position_ids=pos, use_cache=False)
        out.last_hidden_state.float().pow(2).mean().backward()

    def timed(fn) -> float:
        fn()  # warm-up
        ts = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    order = [("peft", step_peft), ("hand-written", step_mine)]
    res = {name: timed(fn) for name, fn in (order if args.peft_first else order[::-1])}
    print(f"top-{top}-block forward+backward, batch 32x56, median of {args.reps}: "
          f"hand-written {res['hand-written'] * 1000:.0f} ms, peft {res['peft'] * 1000:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
