"""Per-response score rows for the tests of scores as labels (tests/pipeline/test_scores.py) and of the
writing-prompts pipeline (tests/recipes/test_writing_prompts.py)."""

from __future__ import annotations

import json
import random

WORDS = "apple river stone cloud table chair window garden letter candle morning silver".split()


def score_rows(n_prompts: int, seed: int = 0) -> list[dict]:
    """Four responses per prompt; a response ending in ' good' scores 5-7, any other 0-2 (the reward model must find
    the word; within a prompt the order of the scores is what a comparison learns)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n_prompts):
        prompt = " ".join(rng.choice(WORDS) for _ in range(6)) + "."
        for _ in range(4):
            good = rng.random() < 0.5
            end = " good" if good else " " + rng.choice(WORDS)
            resp = " " + " ".join(rng.choice(WORDS) for _ in range(4)) + end
            rows.append({"prompt": prompt, "response": resp, "score": 5 * good + rng.randint(0, 2)})
    return rows


def write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)
