"""Methods at matched KL (lmprefs.training.matched_kl and recipes.matched): the interpolation against NumPy's interp,
the range every seed reached, the common KL values, and the verdict naming kinds whose intervals are apart, on
hand-made curves where the answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from lmprefs.recipes.experiment import t975
from lmprefs.recipes.matched import matched_kl, matched_table, seeds_to_part, verdicts
from lmprefs.training.matched_kl import apart, common_kls, interpolate, matched, overlap_kls, reach


def test_interpolation_matches_numpy_inside_the_range_and_refuses_outside():
    rng = np.random.default_rng(0)
    kl = np.sort(rng.uniform(0, 10, 6))
    r = rng.normal(size=6)
    curve = list(zip(kl[::-1].tolist(), r[::-1].tolist(), strict=True))  # any order
    for at in np.linspace(kl[0], kl[-1], 37):
        assert interpolate(curve, float(at)) == pytest.approx(float(np.interp(at, kl, r)), abs=1e-12)
    assert interpolate(curve, float(kl[0]) - 1e-9) is None and interpolate(curve, float(kl[-1]) + 1e-9) is None
    assert interpolate([(1.0, 2.0), (1.0, 4.0), (3.0, 5.0)], 1.0) == 3.0  # ties at one KL averaged
    assert interpolate([(1.0, 2.0), (float("nan"), 9.0)], 1.0) == 2.0  # a point without a KL is left out


def test_reach_is_what_every_seed_reached_and_common_values_sit_inside_all():
    a = [[(0.5, 0.0), (4.0, 1.0)], [(1.0, 0.0), (3.0, 1.0)]]
    b = [[(2.0, 0.0), (6.0, 1.0)], [(2.5, 0.0), (5.0, 1.0)]]
    assert reach(a) == (1.0, 3.0) and reach(b) == (2.5, 5.0)
    kls = common_kls({"a": a, "b": b}, 3)
    assert kls == pytest.approx([2.625, 2.75, 2.875])
    assert common_kls({"a": a, "c": [[(4.0, 0.0), (9.0, 1.0)]]}) == []  # 1-3 and 4-9 share nothing
    assert reach([[(1.0, 0.0)], []]) is None  # a seed with no point


def test_matched_values_and_the_pairs_apart():
    curves = {"a": [[(0.0, 0.0), (2.0, 2.0)], [(0.0, 0.2), (2.0, 2.2)]], "b": [[(0.0, 0.0), (2.0, 0.0)]]}
    assert matched(curves, [1.0]) == {"a": [[1.0, 1.2]], "b": [[0.0]]}
    assert apart({"x": (1.0, 2.0), "y": (0.0, 0.9), "z": (0.5, 1.5)}) == [("x", "y")]


def _data(kinds: dict[str, list[list[tuple[float, float]]]]) -> tuple[dict, list]:
    """results.json of arms with these per-seed curves: kind -> seed -> [(kl, reward) per setting]."""
    data, arms = {"frontier": {"points": [{"kl": 0.0, "reward": 0.0, "trusted": True},
                                          {"kl": 10.0, "reward": 10.0, "trusted": True}]}}, []  # fmt: skip
    for kind, seeds in kinds.items():
        for j in range(len(seeds[0])):
            name = f"{kind}-{j}"
            arms.append((name, kind, f"setting {j}", float(j)))
            for s, curve in enumerate(seeds):
                data[name if s == 0 else f"{name}-seed{s}"] = {"kl": curve[j][0], "mean": curve[j][1]}
    return data, arms


def _three_seeds(a: tuple[float, float], b: tuple[float, float], e: float) -> list[list[tuple[float, float]]]:
    """Three seeds' curves through the (kl, reward) points a and b, their rewards shifted by 0, +e and -e."""
    return [[(a[0], a[1] + d), (b[0], b[1] + d)] for d in (0.0, e, -e)]


def test_the_report_names_the_kind_ahead_beyond_the_seeds_noise_and_only_that():
    hi = _three_seeds((1.0, 1.0), (3.0, 3.0), 0.01)
    lo = _three_seeds((1.0, 0.0), (3.0, 0.5), 0.02)
    close = _three_seeds((1.0, 1.0), (3.0, 3.0), 1.5)
    data, arms = _data({"hi": hi, "lo": lo, "close": close})
    m = matched_kl(data, arms, ("hi", "lo", "close"), 3)
    assert [round(k, 3) for k in m["kls"]] == [1.5, 2.0, 2.5]
    row = m["rows"][1]
    assert row["kinds"]["hi"]["mean"] == pytest.approx(2.0) and row["frontier"] == pytest.approx(2.0)
    assert row["apart"] == [["hi", "lo"]]  # close's wide interval overlaps both
    lines = verdicts(m, 3)
    assert lines[1].startswith("At KL 2.00 nats: hi above lo; of the rest, close and lo would part soonest: at ")
    assert lines[1].endswith(" seeds, were their means and spreads what they are now.") and len(lines) == 3
    # close's mean sits on hi's, so only close and lo could part with more seeds
    assert [p[:2] for p in row["to_part"]] == [["close", "lo"], ["hi", "close"]] and row["to_part"][1][2] is None
    assert row["to_part"][0][2] == seeds_to_part(2.0 - 0.25, row["kinds"]["close"]["sd"], row["kinds"]["lo"]["sd"])
    assert matched_table(m)[0] == "| KL (nats) | close | hi | lo | optimal frontier |"
    assert verdicts(m, 1)[0].startswith("Matched KL: one seed gives no interval")


def test_where_no_value_is_common_each_meeting_of_two_or_more_kinds_is_one_value():
    two = lambda lo, hi: [[(lo, 0.0), (hi, 1.0)]] * 2  # noqa: E731  (two seeds, one curve)
    curves = {"a": two(0.02, 0.08), "b": two(0.35, 1.32), "c": two(0.57, 3.67), "d": two(2.06, 2.17)}
    got = overlap_kls(curves)
    assert [g[1] for g in got] == [["b", "c"], ["c", "d"]]
    assert [g[0] for g in got] == pytest.approx([(0.57 + 1.32) / 2, (2.06 + 2.17) / 2])
    # a kind inside another's range: one value where both are; a kind that reached a single KL is no range
    assert overlap_kls({"x": two(0.0, 4.0), "y": two(1.0, 3.0), "z": two(2.0, 2.0)}) == [(2.0, ["x", "y"])]
    assert overlap_kls({"a": two(0.0, 1.0), "b": two(2.0, 3.0)}) == []


def test_the_report_compares_the_kinds_that_meet_when_none_is_common_to_all():
    hi = _three_seeds((1.0, 1.0), (3.0, 3.0), 0.01)
    lo = _three_seeds((2.0, 0.0), (4.0, 0.5), 0.02)
    far = _three_seeds((5.0, 9.0), (6.0, 9.0), 0.02)
    data, arms = _data({"hi": hi, "lo": lo, "far": far})
    m = matched_kl(data, arms, ("hi", "lo", "far"), 3)
    assert m["partial"] and m["kls"] == [2.5] and set(m["rows"][0]["kinds"]) == {"hi", "lo"}
    assert m["rows"][0]["kinds"]["hi"]["mean"] == pytest.approx(2.5) and m["rows"][0]["apart"] == [["hi", "lo"]]
    lines = verdicts(m, 3)
    assert lines[0].startswith("No KL value was reached by every kind") and "far 5.00-6.00" in lines[0]
    assert "hi 1.00-3.00, lo 2.00-4.00" in lines[0]
    apart_seeds = [[(1.0, 0.0), (2.0, 1.0)], [(3.0, 0.0), (4.0, 1.0)]]  # each seed's range, no value common to both
    data, arms = _data({"hi": hi, "lo": lo, "split": apart_seeds + apart_seeds[:1]})
    split = matched_kl(data, arms, ("hi", "lo", "split"), 3)
    assert "split none common to its seeds (points 1.00-4.00)" in verdicts(split, 3)[0]
    assert lines[1] == "At KL 2.50 nats (hi, lo): hi above lo." and len(lines) == 2
    assert matched_table(m)[0] == "| KL (nats) | hi | lo | optimal frontier |"  # far met no other kind


def test_the_seeds_that_would_part_two_kinds_are_the_fewest_whose_intervals_clear_the_gap():
    assert seeds_to_part(1.0, 0.5, 0.5) == 7  # t975(5) / sqrt(6) = 1.05, t975(6) / sqrt(7) = 0.925 per unit spread
    for gap, sa, sb in [(0.1, 0.05, 0.2), (0.3, 0.0, 0.1), (0.1, 0.3, 0.3), (-0.5, 0.2, 0.1)]:
        scan = next(n for n in range(2, 200) if t975(n - 1) * (sa + sb) / np.sqrt(n) < abs(gap))
        assert seeds_to_part(gap, sa, sb) == scan
    assert seeds_to_part(0.0, 0.1, 0.1) is None and seeds_to_part(0.2, 0.0, 0.0) == 2
    assert seeds_to_part(0.01, 0.3, 0.3) is None  # 1.96 * 0.6 / sqrt(1000) = 0.037: not within 1,000 seeds


def test_no_comparison_is_said_plainly():
    data, arms = _data({"a": [[(0.1, 0.0), (0.2, 1.0)]], "b": [[(1.0, 0.0), (2.0, 1.0)]]})
    m = matched_kl(data, arms, ("a", "b"), 1)
    assert m["kls"] == [] and "share no value: a 0.10-0.20, b 1.00-2.00 nats" in verdicts(m, 1)[0]
    data, arms = _data({"a": [[(0.1, 0.0), (0.2, 1.0)]], "b": [[(1.0, 0.0)]]})
    assert "(b had one)" in matched_kl(data, arms, ("a", "b"), 1)["note"]
