"""Methods compared at matched KL: each method's true reward read off its own curve of (KL, true reward) points, one
curve per seed (the method swept over its KL knob), by linear interpolation at KL values that every method reached
in every seed, so that no method is credited with a reward at a KL it never got to (the protocol of Gao et al. 2022
and Tang et al. 2024: compare policies by the KL they actually reach, not by their knob). Plain Python; the tests
check it against NumPy's interp.

A curve is a list of (kl, reward) points in any order; `curves[method]` a list of curves, one per seed.
"""

from __future__ import annotations

import math

Curve = list[tuple[float, float]]


def interpolate(curve: Curve, at: float) -> float | None:
    """The reward at KL `at` on the piecewise-linear curve through its points sorted by KL; None outside their KL
    range (no extrapolation). Points at one KL are averaged first."""
    pts = _merged(curve)
    if not pts or not pts[0][0] <= at <= pts[-1][0]:
        return None
    for (k0, r0), (k1, r1) in zip(pts, pts[1:], strict=False):
        if k0 <= at <= k1:
            return r0 if k1 == k0 else r0 + (r1 - r0) * (at - k0) / (k1 - k0)
    return pts[0][1]  # a single point, at == its KL


def _merged(curve: Curve) -> Curve:
    by_kl: dict[float, list[float]] = {}
    for kl, r in curve:
        if math.isfinite(kl) and math.isfinite(r):
            by_kl.setdefault(kl, []).append(r)
    return sorted((k, sum(v) / len(v)) for k, v in by_kl.items())


def reach(curves: list[Curve]) -> tuple[float, float] | None:
    """The KL range a method reached in every seed: (the largest of the seeds' smallest KL, the smallest of their
    largest); None when a seed has no point or the seeds' ranges share no value."""
    spans = [(p[0][0], p[-1][0]) for p in map(_merged, curves) if p]
    if not spans or len(spans) < len(curves):
        return None
    lo, hi = max(s[0] for s in spans), min(s[1] for s in spans)
    return (lo, hi) if lo <= hi else None


def common_kls(curves: dict[str, list[Curve]], n: int = 3) -> list[float]:
    """n KL values evenly inside the range every method reached in every seed (at 1/(n+1) .. n/(n+1) of it, so the
    interpolation is never at an edge one seed barely touched); [] when the methods' ranges share no interval."""
    spans = [reach(c) for c in curves.values()]
    if not spans or any(s is None for s in spans):
        return []
    lo, hi = max(s[0] for s in spans if s), min(s[1] for s in spans if s)
    if not lo < hi:
        return []
    return [lo + (hi - lo) * (i + 1) / (n + 1) for i in range(n)]


def overlap_kls(curves: dict[str, list[Curve]]) -> list[tuple[float, list[str]]]:
    """Where no KL value is common to every method: cut the KL axis at every end of a method's reach (the range it
    reached in every seed, a single KL left out); each piece between two neighbouring cuts is reached by one set of
    methods, different from its neighbours'. Per piece reached by two or more, its midpoint and those methods, sorted
    by KL. [] when no two methods' ranges share an interval."""
    spans = {m: s for m, c in curves.items() if (s := reach(c)) is not None and s[0] < s[1]}
    cuts = sorted({x for s in spans.values() for x in s})
    out = []
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        mid = (lo + hi) / 2
        who = sorted(m for m, s in spans.items() if s[0] <= mid <= s[1])
        if len(who) >= 2:
            out.append((mid, who))
    return out


def matched(curves: dict[str, list[Curve]], kls: list[float]) -> dict[str, list[list[float]]]:
    """Per method, per KL value of `kls`, the interpolated reward of each seed (a seed whose curve does not reach a
    value is left out of it)."""
    out = {}
    for method, seeds in curves.items():
        out[method] = [[v for v in (interpolate(c, at) for c in seeds) if v is not None] for at in kls]
    return out


def apart(intervals: dict[str, tuple[float, float]]) -> list[tuple[str, str]]:
    """(higher, lower) for each pair of methods whose intervals (lo, hi) do not overlap, highest first."""
    ranked = sorted(intervals, key=lambda m: -sum(intervals[m]))
    return [(a, b) for i, a in enumerate(ranked) for b in ranked[i + 1 :] if intervals[a][0] > intervals[b][1]]
