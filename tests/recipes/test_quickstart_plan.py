"""`lmprefs quickstart --plan`: the estimate reproduces the full quickstarts it was calibrated on (and the Zen 3 run
measured from outside), grows with the preset's work, and the command prints every stage and writes nothing."""

import dataclasses
import math

import pytest

import lmprefs.runtime.peak
from lmprefs.cli.dispatch import main
from lmprefs.config import preset
from lmprefs.models.flops import ModelFacts
from lmprefs.recipes.plan import Counts
from lmprefs.recipes.quickstart_plan import plan_quickstart
from lmprefs.runtime.peak import matmul_peak

R = dataclasses.replace
SMOLLM2 = {"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
           "intermediate_size": 1536, "num_hidden_layers": 30, "vocab_size": 49152}  # fmt: skip
# the full quickstart's sizes: 889 questions (784 labels trained, 105 held out), 20 updates, 256 x 2 held-out samples
FULL = Counts(32, 3627, 256, 2, 889, 784, 105, 20)
STAGES = ("assets and model", "evaluate initial", "sample and label", "train reward model", "PPO", "evaluate final")


def seconds(cfg=None, counts=FULL, peak=456.3, dtype="float32", load_s=5.0, flags=frozenset()) -> dict[str, float]:
    rows = plan_quickstart(cfg or preset("quickstart"), ModelFacts.from_config(SMOLLM2), counts, peak=peak,
                           dtype=dtype, load_s=load_s, cpu_flags=flags)  # fmt: skip
    return {r["stage"].split(" (")[0]: r["seconds"] for r in rows}


def test_the_estimate_reproduces_the_measured_full_quickstarts():
    # docs/results.md, the faster AMD EPYC, 2026-11-26: fp32 (4300f71, 456.3 GFLOP/s peak) and bf16 (960.6)
    fp32 = {"evaluate initial": 19.6, "sample and label": 109.9, "train reward model": 121.1, "PPO": 145.4,
            "evaluate final": 26.7}  # fmt: skip
    bf16 = {"evaluate initial": 11.2, "sample and label": 65.6, "train reward model": 77.1, "PPO": 94.1,
            "evaluate final": 15.7}  # fmt: skip
    # the Intel Xeon with AMX, 2026-12-07: bf16 (62a3abc, 2,200.3 GFLOP/s peak)
    amx = {"evaluate initial": 11.9, "sample and label": 65.6, "train reward model": 88.3, "PPO": 112.1,
           "evaluate final": 15.4}  # fmt: skip
    avx512 = frozenset({"avx512f", "avx512_bf16"})
    runs = ((fp32, 456.3, "float32", avx512), (bf16, 960.6, "bfloat16", avx512),
            (amx, 2200.3, "bfloat16", avx512 | {"amx_bf16", "amx_tile"}))  # fmt: skip
    for measured, peak, dtype, flags in runs:
        est = seconds(peak=peak, dtype=dtype, flags=flags)
        assert list(est) == list(STAGES)
        for stage, s in measured.items():
            assert est[stage] == pytest.approx(s, rel=0.01), (dtype, stage)
    # the outside measurement on a Zen 3 (AVX2, fp32, 123.4 GFLOP/s peak, 2026-11-27): 1,594 s, 49 s of it
    # the first run's assets; not a calibration point
    zen3 = seconds(peak=123.4, load_s=49.0)
    assert sum(zen3.values()) == pytest.approx(1594, rel=0.05)


def test_each_machine_class_takes_the_shares_measured_on_its_class():
    amx = frozenset({"avx512_bf16", "amx_bf16"})
    # AMX multiplies bf16 five times faster than AVX512-BF16 but leaves the rest of a stage as it was: at the same
    # peak the AMX class's estimate is over twice as long
    assert seconds(peak=2200.3, dtype="bfloat16", flags=amx)["PPO"] > 2 * seconds(peak=2200.3, dtype="bfloat16")["PPO"]
    # fp32 runs on the vector units on every CPU, with or without AMX
    assert seconds(flags=amx) == seconds()


def test_the_estimate_grows_with_the_work_and_shrinks_with_the_peak():
    cfg = preset("quickstart")
    base = seconds(cfg)
    more = seconds(R(cfg, ppo=R(cfg.ppo, total_episodes=2 * cfg.ppo.total_episodes),
                     labels=R(cfg.labels, num_train=2 * cfg.labels.num_train)),
                   counts=FULL._replace(questions=2 * 889, labels_train=2 * 784, labels_heldout=2 * 105, updates=40))
    for stage in ("sample and label", "train reward model", "PPO"):
        assert more[stage] > 1.5 * base[stage], stage
    assert more["evaluate initial"] == base["evaluate initial"]
    twice = seconds(cfg, peak=2 * 456.3)
    assert twice["PPO"] == pytest.approx(base["PPO"] / 2)
    # the tiny preset's work is a small fraction of the quickstart's at the same rates
    small = FULL._replace(questions=54, labels_train=48, labels_heldout=6, updates=2, eval_queries=8)
    tiny = plan_quickstart(preset("tiny"), ModelFacts.from_config(SMOLLM2), small, peak=456.3, dtype="float32",
                           load_s=5.0)
    assert sum(r["seconds"] for r in tiny) < sum(base.values()) / 10


def test_the_peak_probe_measures_a_matmul():
    assert 0 < matmul_peak("cpu", "float32", 1, 64, 2) < math.inf


def test_plan_prints_every_stage_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # where a default run directory would go
    calls = []

    def peak(*args):
        calls.append(args)
        return 100.0

    monkeypatch.setattr(lmprefs.runtime.peak, "matmul_peak", peak)
    args = ["quickstart", "--preset", "tiny", "--plan", "--eval-queries", "8", "--run-dir", str(tmp_path / "q")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert calls and calls[0][:2] == ("cpu", "float32")  # the tiny preset's run.dtype, on this machine's CPU
    assert "matmul peak 100.0 GFLOP/s" in out and "An estimate, not a measurement" in out
    lines = out.splitlines()
    assert [next(ln for ln in lines if ln.startswith(s)) for s in STAGES]
    total = next(ln for ln in lines if ln.startswith("total (estimate)"))
    assert list(tmp_path.iterdir()) == []
    capsys.readouterr()
    # more labels and updates: more GFLOP to run (the seconds include the assets' load, timed)
    assert main([*args, "--labels.num-train", "480", "--ppo.total-episodes", "320"]) == 0
    bigger = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("total (estimate)"))
    assert float(bigger.split()[2].replace(",", "")) > 5 * float(total.split()[2].replace(",", ""))
    assert list(tmp_path.iterdir()) == []
