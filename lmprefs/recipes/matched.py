"""`experiment compare`'s comparison at matched KL: per arm kind, one curve of (KL, held-out true reward) per seed
over its KL knob (kl_coef, dpo.beta, best-of-n's n); the true reward read off every curve at KL values all kinds
reached in every seed (`training.matched_kl`), or, where the kinds' ranges share no value, at the KL values where
two or more of them meet, each compared among those; per value and kind the mean across seeds with a 95% interval
(Student's t), beside the sampled optimal frontier there; a verdict line per value naming the kinds whose intervals
are apart."""

from __future__ import annotations

import math

from lmprefs.errors import UserError
from lmprefs.recipes.experiment import ci95, mean_se, seed_key, t975
from lmprefs.training.matched_kl import apart, common_kls, interpolate, matched, overlap_kls, reach

MATCHED_POINTS = 3  # KL values inside the common range, when none are given


def kind_curves(data: dict, arms: list[tuple[str, str, str, float]], kinds: tuple[str, ...],
                seeds: int) -> dict[str, list[list[tuple[float, float]]]]:  # fmt: skip
    """Per kind with at least two settings, its curve of (kl, true reward) per seed from the finished arms."""
    out = {}
    for kind in kinds:
        names = [a[0] for a in arms if a[1] == kind]
        if len(names) < 2:
            continue
        out[kind] = [[(d["kl"], d["mean"]) for n in names if (d := data.get(seed_key(n, s)))] for s in range(seeds)]
    return out


def check_reach(data: dict, arms: list[tuple[str, str, str, float]], kinds: tuple[str, ...], seeds: int,
                at: tuple[float, ...]) -> None:  # fmt: skip
    """Refuse, before anything is written, --match-kl values outside the KL range a kind whose every arm and seed has
    finished reached in every seed (its curve can no longer grow there), naming the value and the kinds' ranges."""
    finished = {k: c for k, c in kind_curves(data, arms, kinds, seeds).items()
                if all(seed_key(a[0], s) in data for a in arms if a[1] == k for s in range(seeds))}  # fmt: skip
    for kind, curves in finished.items():
        span = reach(curves)
        out = [v for v in at if span is None or not span[0] <= v <= span[1]]
        if out:
            where = f"{span[0]:.2f}-{span[1]:.2f} nats" if span else "no KL range common to its seeds"
            raise UserError(f"--match-kl {','.join(f'{v:g}' for v in at)}: {kind}, finished, reached {where} in every "
                            f"seed, not {out[0]:g} (ranges: {_ranges(finished)})")  # fmt: skip


def matched_kl(data: dict, arms: list[tuple[str, str, str, float]], kinds: tuple[str, ...], seeds: int,
               at: tuple[float, ...] = ()) -> dict:  # fmt: skip
    """results.json's matched_kl: the KL values (`at`, or MATCHED_POINTS inside the common range), and per value each
    kind's mean true reward across seeds with its 95% interval and the seeds it stands on, the frontier's reward
    there, and the pairs of kinds whose intervals are apart. `note` says why there is no comparison."""
    curves = kind_curves(data, arms, kinds, seeds)
    single = [k for k in kinds if k not in curves]
    if len(curves) < 2:
        return {"kls": [], "note": "matched KL needs two or more arm kinds with two or more KL settings each"
                + (f" ({', '.join(single)} had one)" if single else "")}  # fmt: skip
    kls, groups = list(at) or common_kls(curves, MATCHED_POINTS), None
    if not kls:  # no value common to all: where two or more meet, each value compares the kinds that reached it
        pieces = overlap_kls(curves)
        if not pieces:
            return {"kls": [], "note": "the kinds' KL ranges share no value: " + _ranges(curves)}
        kls, groups = [p[0] for p in pieces], [p[1] for p in pieces]
    frontier = [(p["kl"], p["reward"]) for p in data.get("frontier", {}).get("points", []) if p.get("trusted")]
    rows, per_value = [], matched(curves, kls)
    for j, kl in enumerate(kls):
        per_kind = {kind: per_value[kind][j] for kind in (groups[j] if groups else curves)}
        cells = {}
        for kind, xs in per_kind.items():
            if not xs:
                continue
            m, se = mean_se(xs)
            half = ci95(se, len(xs)) if len(xs) > 1 else float("nan")
            cells[kind] = {"mean": m, "ci95": half, "seeds": len(xs), "sd": se * math.sqrt(len(xs))}
        intervals = {k: (c["mean"] - c["ci95"], c["mean"] + c["ci95"]) for k, c in cells.items() if c["seeds"] > 1}
        pairs = [list(p) for p in apart(intervals)]
        rows.append({"kl": kl, "kinds": cells, "frontier": interpolate(frontier, kl), "apart": pairs,
                     "to_part": to_part(cells, pairs)})  # fmt: skip
    return {"kls": kls, "rows": rows, "left_out": single, "ranges": _ranges(curves), "partial": groups is not None}


SEEDS_CAP = 1000  # beyond this many seeds a pair is said not to part at any budget worth planning


def seeds_to_part(gap: float, sd_a: float, sd_b: float, cap: int = SEEDS_CAP) -> int | None:
    """The fewest seeds at which two kinds' 95% intervals (Student's t) would be apart were their means `gap` apart
    and their spreads across seeds sd_a and sd_b, as now: the smallest n >= 2 with
    t975(n - 1) (sd_a + sd_b) / sqrt(n) < |gap| (the left side falls as n grows); None when no n up to `cap` does."""

    def parts(n: int) -> bool:
        return t975(n - 1) * (sd_a + sd_b) / math.sqrt(n) < abs(gap)

    if not parts(cap):
        return None
    lo, hi = 1, cap  # parts(hi); lo is below every n that parts
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if parts(mid) else (mid, hi)
    return hi


def to_part(cells: dict, pairs: list[list[str]]) -> list[list]:
    """[higher, lower, seeds or None] for every pair of kinds with two or more seeds whose intervals are not apart,
    the seeds at which they would be (seeds_to_part), fewest first, None last."""
    kinds = sorted((k for k, c in cells.items() if c["seeds"] > 1), key=lambda k: -cells[k]["mean"])
    out = [[a, b, seeds_to_part(cells[a]["mean"] - cells[b]["mean"], cells[a]["sd"], cells[b]["sd"])]
           for i, a in enumerate(kinds) for b in kinds[i + 1 :] if [a, b] not in pairs]  # fmt: skip
    return sorted(out, key=lambda p: (p[2] is None, p[2] or 0))


def _ranges(curves: dict) -> str:
    """Each kind's KL range reached in every seed, or where its seeds share none, the span of its points."""
    spans = []
    for kind, seeds in curves.items():
        span, pts = reach(seeds), [kl for c in seeds for kl, _ in c]
        if span:
            spans.append(f"{kind} {span[0]:.2f}-{span[1]:.2f}")
        elif pts:
            spans.append(f"{kind} none common to its seeds (points {min(pts):.2f}-{max(pts):.2f})")
        else:
            spans.append(f"{kind} none")
    return ", ".join(spans) + " nats"


def verdicts(m: dict, seeds: int) -> list[str]:
    """One line per matched KL value: the kinds whose 95% intervals are apart, or that none are."""
    if not m["kls"]:
        return [f"Matched KL: no comparison ({m['note']})."]
    if seeds < 2:
        return ["Matched KL: one seed gives no interval across seeds; run --seeds 3 or more for a verdict."]
    out = [f"No KL value was reached by every kind in every seed ({m['ranges']}): each value below compares only the "
           "kinds that reached it, named in brackets."] if m.get("partial") else []
    for row in m["rows"]:
        pairs = [f"{a} above {b}" for a, b in row["apart"]]
        said = "; ".join(pairs) if pairs else "no kind's interval is apart from another's: no ranking holds"
        among = f" ({', '.join(sorted(row['kinds']))})" if m.get("partial") else ""
        if row.get("to_part"):
            a, b, n = row["to_part"][0]
            said += (f"; of the rest, {a} and {b} would part soonest: " + (f"at {n} seeds" if n else
                     f"not within {SEEDS_CAP} seeds") + ", were their means and spreads what they are now")
        out.append(f"At KL {row['kl']:.2f} nats{among}: {said}.")
    return out


def matched_table(m: dict) -> list[str]:
    """The markdown table: a row per matched KL value, a column per kind (mean +/- 95% half-width, seeds)."""
    if not m["kls"]:
        return []
    kinds = sorted({k for row in m["rows"] for k in row["kinds"]})
    lines = ["| KL (nats) | " + " | ".join(kinds) + " | optimal frontier |", "|---" * (len(kinds) + 2) + "|"]
    for row in m["rows"]:
        cells = []
        for k in kinds:
            c = row["kinds"].get(k)
            cells.append("-" if c is None else f"{c['mean']:+.4f} +/- {c['ci95']:.4f} ({c['seeds']})")
        f = row["frontier"]
        lines.append(f"| {row['kl']:.2f} | " + " | ".join(cells) + f" | {'-' if f is None else f'{f:+.4f}'} |")
    return lines
