"""How far each labeler can be trusted, from the store alone (no torch): accuracy on gold questions with a Wilson
interval, agreement with the majority of the other labelers and chance-corrected agreement (Cohen's kappa per pair,
Fleiss' kappa over everyone), which displayed position they pick (position bias), and their time on task.

All of it counts `label`s on best_of_N items only; skips and flags are not judgements. Gold accuracy counts each
labeler's first answer to a gold question, so changing an answer with undo cannot raise it. Answers are compared by the
stored sample index (`best`), so two labelers shown different orders still agree when they pick the same text.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import combinations

Z95 = 1.959964  # two-sided 95% normal quantile


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """Wilson score interval for k successes in n trials (Wilson 1927); well behaved at k = 0 or n, unlike p +/- z*se.
    None when n = 0."""
    if n == 0:
        return None
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (0.0 if k == 0 else centre - half), (1.0 if k == n else centre + half)  # exact ends, not 1e-17


def cohen_kappa(pairs: list[tuple[int, int]]) -> float | None:
    """Cohen's kappa of two raters' answers [(a, b), ...]: (p_observed - p_chance) / (1 - p_chance), p_chance from
    each rater's own answer frequencies. None with no pairs or when chance agreement is 1 (both always answer the same
    single option: nothing to correct)."""
    n = len(pairs)
    if n == 0:
        return None
    po = sum(a == b for a, b in pairs) / n
    ca, cb = Counter(a for a, _ in pairs), Counter(b for _, b in pairs)
    pe = sum(ca[k] * cb[k] for k in ca) / (n * n)
    return None if pe >= 1 else (po - pe) / (1 - pe)


def fleiss_kappa(items: list[list[int]]) -> float | None:
    """Fleiss' kappa over items each answered by >= 2 raters (the raters may differ per item, and so may their
    number: P_i = sum_j n_ij (n_ij - 1) / (n_i (n_i - 1)), P_e = sum_j p_j^2 with p_j over all answers)."""
    items = [a for a in items if len(a) >= 2]
    if not items:
        return None
    p_bar = statistics.fmean(sum(c * (c - 1) for c in Counter(a).values()) / (len(a) * (len(a) - 1)) for a in items)
    totals = Counter(x for a in items for x in a)
    n = sum(totals.values())
    pe = sum((c / n) ** 2 for c in totals.values())
    return None if pe >= 1 else (p_bar - pe) / (1 - pe)


@dataclass(frozen=True)
class LabelerQuality:
    name: str
    gold_correct: int
    gold_answered: int
    majority_agree: int  # items where this labeler picked what the majority of the others picked
    majority_items: int  # items where >= 2 others answered and more than half of them picked the same sample
    positions: list[int]  # picks per displayed position (1st, 2nd, ...), where the displayed order was stored
    seconds: list[float]  # time on task of each answer (labels, skips and flags) that recorded it

    @property
    def gold_accuracy(self) -> float | None:
        return self.gold_correct / self.gold_answered if self.gold_answered else None

    @property
    def gold_interval(self) -> tuple[float, float] | None:
        return wilson(self.gold_correct, self.gold_answered)

    @property
    def majority_rate(self) -> float | None:
        return self.majority_agree / self.majority_items if self.majority_items else None

    def fast(self, threshold: float) -> int:
        return sum(s < threshold for s in self.seconds)

    def quantile(self, q: float) -> float | None:
        """The q-quantile of time on task (q = 0.5: the median)."""
        if not self.seconds:
            return None
        s = sorted(self.seconds)
        return s[min(len(s) - 1, int(q * len(s)))]


@dataclass(frozen=True)
class Quality:
    labelers: dict[str, LabelerQuality]
    kappa_pairs: dict[tuple[str, str], tuple[float | None, int]] = field(default_factory=dict)  # (a, b) -> (k, items)
    fleiss: float | None = None
    fleiss_items: int = 0


def quality(store) -> Quality:
    """Every labeler's quality numbers from one snapshot of `store`."""
    names, rows = store.best_of_answers()
    gold: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    positions: dict[str, Counter] = defaultdict(Counter)
    seconds: dict[str, list[float]] = defaultdict(list)
    by_item: dict[int, dict[str, int]] = defaultdict(dict)
    width = 0
    for item_id, name, kind, best, shown, secs, gold_best, first_kind, first_best in rows:
        if secs is not None:
            seconds[name].append(secs)
        if gold_best is not None and first_kind == "label":  # the first answer: an undo cannot improve it
            gold[name][0] += first_best == gold_best
            gold[name][1] += 1
        if kind != "label":
            continue
        by_item[item_id][name] = best
        if shown:
            width = max(width, len(shown))
            positions[name][shown.index(best)] += 1
    majority: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    pairs: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for answers in by_item.values():
        for name, best in answers.items():
            others = [b for n, b in answers.items() if n != name]
            top, votes = Counter(others).most_common(1)[0] if others else (None, 0)
            if len(others) >= 2 and votes * 2 > len(others):  # a true majority of at least two others
                majority[name][0] += best == top
                majority[name][1] += 1
        for a, b in combinations(sorted(answers), 2):
            pairs[(a, b)].append((answers[a], answers[b]))
    shared = [list(a.values()) for a in by_item.values() if len(a) >= 2]
    return Quality(
        {
            n: LabelerQuality(n, gold[n][0], gold[n][1], majority[n][0], majority[n][1],
                              [positions[n][p] for p in range(width)], seconds[n])  # fmt: skip
            for n in names
        },
        {k: (cohen_kappa(v), len(v)) for k, v in sorted(pairs.items())},
        fleiss_kappa(shared),
        len(shared),
    )


def select_labelers(examples: list, store, min_gold_accuracy: float) -> tuple[list, dict[str, dict]]:
    """Drop the examples of labelers whose gold accuracy is under `min_gold_accuracy` (labelers without gold answers
    stay). -> (kept examples, {labeler: {"labels": used, "gold": [correct, answered] or None, "dropped": bool,
    "weight": chance-corrected gold accuracy, or 1 without gold answers}})."""
    gold = store.gold_accuracy()
    report: dict[str, dict] = {}
    for e in examples:
        if e.labeler not in report:
            k, n = gold.get(e.labeler, (0, 0))
            chance = 1 / len(e.samples)
            weight = max(0.0, (k / n - chance) / (1 - chance)) if n else 1.0
            report[e.labeler] = {"labels": 0, "gold": [k, n] if n else None, "weight": round(weight, 4)}
    for r in report.values():
        r["dropped"] = r["gold"] is not None and r["gold"][0] / r["gold"][1] < min_gold_accuracy
    kept = [e for e in examples if not report[e.labeler]["dropped"]]
    for e in kept:
        report[e.labeler]["labels"] += 1
    return kept, dict(sorted(report.items()))


def describe_labelers(report: dict[str, dict], weighted: bool = False) -> str:
    """'alice 120 (gold 23/25), bob dropped (gold 8/20)' for the train-reward summary (with weights if `weighted`)."""
    parts = []
    for name, r in report.items():
        gold = f"gold {r['gold'][0]}/{r['gold'][1]}" if r["gold"] else "no gold answers"
        weight = f", weight {r['weight']:.2f}" if weighted and not r["dropped"] else ""
        parts.append(f"{name} {'dropped' if r['dropped'] else r['labels']} ({gold}{weight})")
    return ", ".join(parts)
