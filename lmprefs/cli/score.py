"""`lmprefs score`: rewards of texts under a saved reward model."""

from __future__ import annotations

import sys
from typing import cast

from lmprefs.cli.common import command_parser
from lmprefs.errors import UserError
from lmprefs.io.inputs import decode_text, input_dir, read_text


def score_cli(a) -> int:
    from lmprefs.models.ensemble import RewardEnsemble, is_reward_dir, load_reward
    from lmprefs.recipes.score import member_scores_texts, reward_model_task
    from lmprefs.runtime.device import pick_device

    path = input_dir(a.reward_model, "--reward-model", "reward-model directory")
    if not is_reward_dir(path):
        raise UserError(f"--reward-model {path}: not a reward-model directory (no sequence classifier with "
                        "num_labels=1) nor a reward-model ensemble (no ensemble.json)")  # fmt: skip
    task = reward_model_task(path)
    if a.file:
        text = read_text(a.file, "input file")
    else:  # bytes, so that text in another encoding is named, not a traceback (a replaced stdin may have none)
        buffer = getattr(sys.stdin, "buffer", None)
        text = decode_text(buffer.read(), "stdin") if buffer is not None else sys.stdin.read()
    lines = text.splitlines()
    # a line with a tab splits in two: (query, response)
    pairs = [cast("tuple[str, str]", tuple(line.split("\t", 1))) if "\t" in line else ("", line)
             for line in lines if line.strip()]  # fmt: skip
    if not pairs:
        raise UserError("no texts to score (one per line on stdin or in the file)")
    device = pick_device(a.device, "--device")
    rm = load_reward(path, device).eval()
    scores, counts = member_scores_texts(rm, task, pairs, device, truncate=a.truncate)  # [K, N]
    if isinstance(rm, RewardEnsemble):  # the members' mean, then their spread (std over members)
        print(f"# ensemble of {len(rm)}: mean\tspread\ttext", file=sys.stderr)
        rows = zip(RewardEnsemble.mean(scores).tolist(), RewardEnsemble.spread(scores).tolist(), strict=True)
        for (_, r), (m, s) in zip(pairs, rows, strict=True):
            print(f"{m:+.4f}\t{s:.4f}\t{r}")
    else:
        for (_, r), s in zip(pairs, scores[0].tolist(), strict=True):
            print(f"{s:+.4f}\t{r}")
    if counts["longer"]:  # on stderr, so stdout stays one score per input line
        how = ("cut to those lengths (--truncate)" if a.truncate else
               "scored whole; the model was not trained on texts this long (--truncate cuts them as in training)")
        print(f"lmprefs score: warning: {counts['longer']} of {len(pairs)} texts are longer than the reward model's "
              f"training (query {task['query_length']}, response {task['response_length']} tokens): {how}"
              + (f"; {counts['cut']} cut to the model's context" if counts["cut"] and not a.truncate else ""),
              file=sys.stderr)  # fmt: skip
    return 0


def cmd_score(argv: list[str]) -> int:
    usage = "lmprefs score --reward-model DIR [FILE]  (one text per line; '\\t' separates query and response)"
    p = command_parser("score", usage)
    p.add_argument("file", nargs="?", help="texts, one per line (default: stdin)")
    p.add_argument("--reward-model", required=True,
                   help="a reward-model directory saved by train-reward, or an ensemble's "
                   "(train_reward.ensemble > 1): each line then reads mean, spread (std over members), "
                   "text")  # fmt: skip
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    p.add_argument("--truncate", action="store_true",
                   help="cut texts to the trained query/response lengths (default: score whole texts, up to the "
                   "model's context, with a warning for texts longer than the training ones)")  # fmt: skip
    a = p.parse_args(argv)

    return score_cli(a)
