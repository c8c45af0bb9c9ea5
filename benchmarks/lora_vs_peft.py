"""lmprefs' hand-written LoRA (lmprefs.models.lora) against peft's on SmolLM2-135M: the same adapters (rank 8,
alpha 16, q/k/v/o in the top 8 of 30 blocks), one forward + backward of the top blocks only (the frozen prefix
computed once, as lmprefs does in PPO and reward training), batch 32 x 56 tokens, fp32, 2 threads.

The adapters sit on the layers of lmprefs' default lora.targets that the model has (SmolLM2: q/k/v/o_proj; GPT-2:
c_attn and c_proj, as Conv1D). Both start as the identity (B = 0), so both must give the base model's hidden
states: the script checks that before timing and reports the largest difference.

    python3 benchmarks/lora_vs_peft.py [--reps 5] [--peft-first] [--json FILE]
    python3 benchmarks/lora_vs_peft.py --model tiny-gpt2 --layers 1 --batch 2 --seq-len 8 --reps 1   # seconds
"""

from __future__ import annotations

import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch
from _common import ArgumentParser, positive_int, run_main
from transformers import PreTrainedModel

# lmprefs internals this script uses, all in this block
from lmprefs.config import LoraConfig
from lmprefs.models.loading import load_lm, trunk_blocks
from lmprefs.models.lora import add_adapter, using
from lmprefs.models.trunk import _only_blocks, attention_mask, frozen_prefix, model_inputs, trunk_hidden


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    from peft import LoraConfig as PeftLoraConfig  # seconds to import: after the flags are checked
    from peft import get_peft_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base, tok = load_lm(args.model)
    n_blocks, top = len(trunk_blocks(base)), args.layers
    if top > n_blocks:
        ap.error(f"--layers {top}: {args.model} has {n_blocks} blocks")
    names = {n.split(".")[-1]: type(m).__name__ for n, m in base.named_modules()}
    targets = tuple(t for t in LoraConfig().targets if names.get(t) in ("Linear", "Conv1D"))
    tokens = torch.randint(0, len(tok), (args.batch, args.seq_len))

    lcfg = LoraConfig(rank=args.rank, alpha=2.0 * args.rank, layers=top, targets=targets)
    mine = HandWrittenLora(base, lcfg, tokens)
    peft_cfg = PeftLoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=list(targets), lora_dropout=0.0,
                              layers_to_transform=list(range(n_blocks - top, n_blocks)),
                              fan_in_fan_out=any(names[t] == "Conv1D" for t in targets))  # fmt: skip
    # the causal LM holding peft's layers
    peft_lm = cast(PreTrainedModel, get_peft_model(copy.deepcopy(base), peft_cfg).base_model.model)
    theirs = PeftLora(peft_lm, tokens, n_blocks - top)

    diff, n_lora = compare_to_base(base, tokens, mine, theirs)
    if diff > 1e-3 or n_lora["hand-written"] != n_lora["peft"]:
        print(f"the two adapters differ: largest hidden-state difference from the base {diff:.2e}, trainable "
              f"parameters {n_lora}", file=sys.stderr)  # fmt: skip
        return 1

    order = [("peft", theirs.step), ("hand-written", mine.step)]
    times = {name: timed(fn, args.reps) for name, fn in (order if args.peft_first else order[::-1])}
    res = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"top-{top}-block forward+backward, batch {args.batch}x{args.seq_len}, median of {args.reps}: "
          f"hand-written {res['hand-written'] * 1000:.0f} ms, peft {res['peft'] * 1000:.0f} ms")  # fmt: skip
    if args.json:
        out = {"model": args.model, "blocks": n_blocks, "layers": top, "rank": args.rank, "targets": list(targets),
               "batch": args.batch, "seq_len": args.seq_len, "threads": torch.get_num_threads(), "reps": args.reps,
               "seconds_median": res, "seconds_all": times, "trainable_params": n_lora,
               "max_abs_diff_from_base": diff}  # fmt: skip
        Path(args.json).write_text(json.dumps(out) + "\n")
    return 0


def parser() -> ArgumentParser:
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="an lmprefs model asset or a local HF directory")
    ap.add_argument("--layers", type=positive_int, default=8, help="top blocks with adapters (lora.layers)")
    ap.add_argument("--rank", type=positive_int, default=8, help="LoRA rank (alpha = 2 x rank)")
    ap.add_argument("--batch", type=positive_int, default=32, help="token rows per step")
    ap.add_argument("--seq-len", type=positive_int, default=56, help="tokens per row")
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--reps", type=positive_int, default=5, help="timed repetitions (the median is printed)")
    ap.add_argument("--peft-first", action="store_true", help="time peft first (to see order effects)")
    ap.add_argument("--json", default=None, help="also write the figures here as one JSON object")
    return ap


class HandWrittenLora:
    """lmprefs' adapters on a copy of the model; a step runs its adapted top blocks from the frozen prefix, which is
    computed once."""

    def __init__(self, base: PreTrainedModel, cfg: LoraConfig, tokens: torch.Tensor):
        self.model, self.tokens = copy.deepcopy(base), tokens
        add_adapter(self.model, cfg, "policy")
        with using(self.model, "policy"):
            self.pre = frozen_prefix(self.model, tokens)

    def hidden(self) -> torch.Tensor:
        with using(self.model, "policy"):
            return trunk_hidden(self.model, self.tokens, self.pre)

    def step(self) -> None:
        self.hidden().float().pow(2).mean().backward()


class PeftLora:
    """peft's adapters (in `model`, from `start` up); a step runs the blocks from `start` on the hidden states below
    them, which are computed once."""

    def __init__(self, model: PreTrainedModel, tokens: torch.Tensor, start: int):
        self.model, self.start = model, start
        ids, mask, self.pos = model_inputs(tokens)
        self.mask = attention_mask(model, mask)
        with torch.no_grad(), _only_blocks(model, 0, start, final_norm=False):
            self.hp = model.base_model(input_ids=ids, attention_mask=self.mask, position_ids=self.pos,
                                       use_cache=False).last_hidden_state  # fmt: skip

    def hidden(self) -> torch.Tensor:
        with _only_blocks(self.model, self.start, None, from_hidden=True):
            out = self.model.base_model(inputs_embeds=self.hp, attention_mask=self.mask, position_ids=self.pos,
                                        use_cache=False)  # fmt: skip
        return out.last_hidden_state

    def step(self) -> None:
        self.hidden().float().pow(2).mean().backward()


def compare_to_base(base: PreTrainedModel, tokens: torch.Tensor, mine: HandWrittenLora,
                    theirs: PeftLora) -> tuple[float, dict[str, int]]:  # fmt: skip
    """Both adapters start as the identity: the same hidden states as the base model's, or the race is not fair.
    Returns the largest difference from the base and each side's trainable parameters."""
    with torch.no_grad():
        h_mine, h_peft, h_base = mine.hidden(), theirs.hidden(), trunk_hidden(base, tokens)
    diff = max((h_mine - h_base).abs().max().item(), (h_peft - h_base).abs().max().item())
    n_lora = {"hand-written": sum(p.numel() for p in mine.model.parameters() if p.requires_grad),
              "peft": sum(p.numel() for p in theirs.model.parameters() if p.requires_grad)}  # fmt: skip
    return diff, n_lora


def timed(fn: Callable[[], None], reps: int) -> list[float]:
    fn()  # warm-up
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return ts


if __name__ == "__main__":
    sys.exit(run_main(main))
