"""The benchmark scripts are not tests, but they must keep running: each runs here once, end to end, at toy sizes
(a script that cannot run is a failing test), and its bad flags are one line and exit 2."""

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def run_script(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python benchmarks/NAME args` with this checkout's lmprefs first on the path: a script's own folder is on
    sys.path, the checkout is not, and an installed lmprefs (another checkout) would answer instead. Its temporary
    files go to a folder of their own, which must be empty when it ends: a benchmark cleans up after itself."""
    with tempfile.TemporaryDirectory(prefix="bench-tmp-") as tmp:
        path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        env = {**os.environ, "PYTHONPATH": path, "TMPDIR": tmp}
        r = subprocess.run([sys.executable, str(BENCH / name), *args], capture_output=True, text=True, cwd=ROOT,
                           env=env, timeout=timeout)  # fmt: skip
        # torch's compile cache (torchinductor_USER) is a cache, not a leftover
        left = sorted(p.name for p in Path(tmp).iterdir() if not p.name.startswith("torchinductor_"))
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert not left, f"{name} left {left} in its temporary folder"
    return r


@pytest.mark.heavy
def test_gpu_throughput_runs_on_cpu_at_toy_sizes(tmp_path):
    out = tmp_path / "r.json"
    r = run_script("gpu_throughput.py", "--device", "cpu", "--model", "tiny-gpt2", "--batch", "4", "--query-len", "8",
                   "--response-len", "4", "--noptepochs", "1", "--updates", "1", "--warmup", "0", "--sampler-reps",
                   "1", "--threads", "1", "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["batch"] == 4 and res["updates_timed"] == 1
    sec = res["seconds_per_update"]
    assert sec["total"] > 0 and all(sec[k] >= 0 for k in ("generation", "rollout_forward", "scoring", "optimization"))
    assert abs(sum(sec[k] for k in ("generation", "rollout_forward", "scoring", "optimization")) - sec["total"]) < 1e-6
    assert res["model_tflop_per_update"]["total"] > 0 and res["projected_1M_episodes_min"] > 0
    assert set(res["sampler_alone"]) == {"dynamic", "static", "hf_generate", "hf_generate_static"}
    assert "episodes/s" in r.stdout and "HF generate" in r.stdout


@pytest.mark.skipif(not (ROOT.parent / "shared" / "bench" / "_anchor_common.py").is_file(),
                    reason="the speed anchor's harness (../shared/bench: its queries and model) is not beside this "
                    "checkout")  # fmt: skip
@pytest.mark.heavy
def test_ppo_throughput_runs_both_value_models_against_an_anchor_result_from_a_file(tmp_path):
    """TRL's side read from a file in the anchor's result format (TRL is not installed here); lmprefs' side runs
    for real: its reward function, both value models, the ratios and the FLOP model."""
    from lmprefs.assets.models import resolve_model

    cfg = json.loads((Path(resolve_model("tiny-gpt2")) / "config.json").read_text())
    anchor = {
        "bench": "trl_ppo", "ppo_trainer": "made-up.PPOTrainer", "versions": {"trl": "none"},
        "model": {k: cfg[k] for k in ("n_layer", "n_head", "n_embd", "vocab_size")},
        "config": {"batch_size": 4, "query_len": 8, "response_len": 4, "ppo_epochs": 1, "minibatches": 1,
                   "temperature": 0.7},
        "episodes_per_sec": 2.0,
        "sec_per_step_mean": {"total_s": 2.0, "generation_s": 0.5, "rollout_forward_s": 0.5, "scoring_s": 0.0,
                              "optimization_s": 1.0},
        "per_step": [], "cpu_during_train": {"other_cores_avg": 0.0, "own_cores_avg": 1.0, "wall_s": 4.0},
    }  # fmt: skip
    (tmp_path / "anchor.json").write_text(json.dumps(anchor))
    out = tmp_path / "out"
    r = run_script("ppo_throughput.py", "--model-dir", "tiny-gpt2", "--anchor-result", str(tmp_path / "anchor.json"),
                   "--out-dir", str(out), "--batch-size", "4", "--query-len", "8", "--response-len", "4", "--steps",
                   "2", "--ppo-epochs", "1", "--minibatches", "1", "--threads", "1", "--reps", "1", "--max-wait",
                   "0", "--max-other", "99", "--retries", "0")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "FAILED" not in r.stderr, r.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert res["systems"]["trl"]["episodes_per_sec_median"] == 2.0
    for mode in ("shared", "separate"):
        (run,) = res["runs"][mode]
        assert run["bench"] == f"lmprefs_ppo[{mode}]" and run["model"]["value_model"] == mode
        assert run["model"]["n_layer"] == cfg["n_layer"] and len(run["per_step_total_s"]) == 2
        sec = run["sec_per_step_mean"]
        phases = ("generation_s", "rollout_forward_s", "scoring_s", "optimization_s")
        assert sec["total_s"] > 0 and all(sec[k] >= 0 for k in phases)
        assert math.isclose(sum(sec[k] for k in phases), sec["total_s"], abs_tol=1e-3)
        eps = run["episodes_per_sec"]  # one timed update of 4 episodes
        assert eps > 0 and math.isclose(eps, 4 / run["per_step_total_s"][1], rel_tol=0.01)
        assert 0 <= run["last_metrics"]["objective/score"] <= 1  # the fraction of 'e's: the reward ran
        assert res["systems"][mode]["episodes_per_sec_median"] == eps
        assert math.isclose(res["ratios"][mode]["ratio_of_medians"], eps / 2.0, rel_tol=1e-9)
    fm = res["flop_model_gflop"]
    assert fm["trl"] > 0 and 0 < fm["lmprefs shared"] < fm["lmprefs separate"]
    assert "TRL side read from" in r.stdout and "ratio" in r.stdout
    assert [res["ratios"][m]["target"] for m in ("shared", "separate")] == [3.0, 1.6]  # fp32's targets
    for mode in ("shared", "separate"):  # per CPU-second: 2 updates x 4 episodes over the CPU time of the call
        cpu = res["runs"][mode][0]["cpu_during_train"]
        # its CPU seconds unrounded (the cores are rounded to 0.01); the anchor's file has none: cores x wall
        assert math.isclose(cpu["own_cpu_s"], cpu["own_cores_avg"] * cpu["wall_s"], rel_tol=0.05, abs_tol=0.05)
        mine = 8 / cpu["own_cpu_s"]
        (ratio,) = res["ratios"][mode]["per_cpu_second"]["per_round"]
        assert math.isclose(ratio, mine / 2.0, rel_tol=1e-9)
    assert "per CPU-second" in r.stdout


def test_the_anchor_runs_with_its_cpu_seconds_unrounded(tmp_path):
    """TRL's side runs through _exact_cpu.py, which adds the unrounded CPU seconds to the anchor's CpuMonitor record
    (a stand-in anchor here: TRL is not installed)."""
    (tmp_path / "_anchor_common.py").write_text(
        "import os, time\n"
        "class CpuMonitor:\n"
        "    def start(self):\n"
        "        t = os.times(); self.o0, self.t0 = t.user + t.system, time.perf_counter(); return self\n"
        "    def stop(self):\n"
        "        t = os.times(); own = t.user + t.system - self.o0\n"
        "        return {'own_cores_avg': round(own / (time.perf_counter() - self.t0), 2)}\n")  # fmt: skip
    (tmp_path / "bench.py").write_text(
        "import json, sys, time\nimport _anchor_common as common\nm = common.CpuMonitor().start()\n"
        "t = time.process_time()\nwhile time.process_time() - t < 0.2: pass\n"
        "print(json.dumps({'argv': sys.argv[1:], 'cpu': m.stop()}))\n")  # fmt: skip
    r = subprocess.run([sys.executable, str(BENCH / "_exact_cpu.py"), str(tmp_path / "bench.py"), "--steps", "2"],
                       capture_output=True, text=True, check=True)  # fmt: skip
    out = json.loads(r.stdout)
    assert out["argv"] == ["--steps", "2"] and 0.15 <= out["cpu"]["own_cpu_s"] < 5 and "own_cores_avg" in out["cpu"]


def test_gpu_kernels_measures_on_cuda_and_says_in_one_line_where_it_cannot():
    import importlib.util

    import torch

    r = run_script("gpu_kernels.py")
    if not (torch.cuda.is_available() and importlib.util.find_spec("triton")):
        assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout)
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith("gpu_kernels.py: needs ") and "nothing measured" in line
        return
    assert r.returncode == 0, r.stderr[-3000:]
    attn = re.findall(r"^decode attention (.+?)\s+([\d.]+) us", r.stdout, re.M)
    heads = re.findall(r"^LM head\s+(\d+) x \d+ x (\d+):\s+([\d.]+) us\s+([\d.]+) TFLOP/s", r.stdout, re.M)
    assert attn and all(float(t) > 0 for _, t in attn), r.stdout
    assert len(heads) == 6 and all(float(t) > 0 and float(f) > 0 for *_, t, f in heads), r.stdout


@pytest.mark.heavy
def test_best_of_n_sampling_runs_at_toy_size(tmp_path):
    out = tmp_path / "r.json"
    r = run_script("best_of_n_sampling.py", "--model", "tiny-gpt2", "--questions", "2", "--n", "3", "--query-len", "8",
                   "--response-len", "4", "--reps", "2", "--threads", "1", "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert (res["questions"], res["n"], res["reps"], res["threads"]) == (2, 3, 2, 1)
    plain, shared = res["seconds_repeated_queries"], res["seconds_shared_prefill"]
    assert plain > 0 and shared > 0 and math.isclose(res["time_ratio"], shared / plain)
    assert all(len(v) == 2 for v in res["seconds_all"].values())  # the warm-up call of each way left out
    assert res["rows"] == 3 * 2 * 3  # every call (warm-up too) compares 2 queries x 3 samples
    # both ways draw the same tokens up to float rounding: in fp32 on a tiny model, nearly every row
    assert res["identical_rows"] >= res["rows"] // 2
    assert f"{res['identical_rows']} of {res['rows']} rows" in r.stdout and "one prefill per query" in r.stdout


def test_cpu_attention_runs_at_toy_size(tmp_path):
    out = tmp_path / "r.json"
    r = run_script("cpu_attention.py", "--shapes", "2:1:8:fwd,2:8:8:train,1:129:129:fwd", "--heads", "4:2:8",
                   "--reps", "2", "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert (res["threads"], res["dtype"], res["reps"]) == (1, "bfloat16", 2)
    assert [(s["rows"], s["query_len"], s["pass"], s["eager"]) for s in res["shapes"]] == [
        (2, 1, "forward", True), (2, 8, "forward+backward", True), (1, 129, "forward", False)]
    for s in res["shapes"]:
        assert s["ms"]["sdpa"] > 0 and s["ms"]["lmprefs"] > 0
        assert math.isclose(s["ratio"], s["ms"]["lmprefs"] / s["ms"]["sdpa"], rel_tol=1e-9)
        assert max(s["max_error"].values()) < 0.1  # both within bf16 rounding of the fp64 attention
    assert "ratio" in r.stdout and "(eager)" in r.stdout and "(sdpa)" in r.stdout


@pytest.mark.heavy
def test_lora_vs_peft_runs_at_toy_size(tmp_path):
    out = tmp_path / "r.json"
    r = run_script("lora_vs_peft.py", "--model", "tiny-gpt2", "--layers", "1", "--batch", "2", "--seq-len", "8",
                   "--reps", "2", "--threads", "1", "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["targets"] == ["c_attn", "c_proj"] and (res["blocks"], res["layers"]) == (2, 1)  # GPT-2's Conv1D
    # the same adapters: as many trainable parameters, and both start as the base model (B = 0)
    assert res["trainable_params"]["hand-written"] == res["trainable_params"]["peft"] > 0
    assert res["max_abs_diff_from_base"] < 1e-5
    for name in ("hand-written", "peft"):
        assert len(res["seconds_all"][name]) == 2 and res["seconds_median"][name] > 0
    assert "top-1-block forward+backward, batch 2x8, median of 2" in r.stdout


@pytest.mark.heavy
def test_reward_accuracy_runs_on_the_tiny_preset(tmp_path):
    out = tmp_path / "out"
    r = run_script("reward_accuracy.py", "--preset", "tiny", "--labels", "4,8", "--heldout", "8", "--epochs", "1",
                   "--threads", "1", "--dtype", "float32", "--out-dir", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert res["collect"]["labels_added"] == res["collect"]["labels_in_store"] == 8 + 8
    rows = res["rows"]
    assert [row["labels"] for row in rows] == [4, 8] and [row["labels_train"] for row in rows] == [4, 8]
    # one held-out set for every N (the script's own check), so the same accuracy before training too
    assert len({row["heldout_fingerprint"] for row in rows}) == 1 and rows[0]["labels_heldout"] > 0
    assert rows[0]["labels_heldout"] == rows[1]["labels_heldout"]
    assert rows[0]["initial_heldout_accuracy"] == rows[1]["initial_heldout_accuracy"]
    for row in rows:
        lo, hi = row["heldout_accuracy_95ci"]
        assert 0 <= lo <= row["heldout_accuracy"] <= hi <= 1 and row["heldout_loss"] > 0
        assert 0 < row["train_real_tokens_per_s"] <= row["train_positions_per_s"] and row["train_epoch_s"] > 0
    assert 0.25 <= res["label_ceiling"] <= 1  # noiseless labels: the labeled best is always among the tied top
    assert "held-out set identical for every N: yes" in r.stdout
    assert not list(out.glob("rm-*")), "a reward model was left in --out-dir without --keep-models"


@pytest.mark.heavy
def test_reward_ensemble_cost_runs_on_the_tiny_preset(tmp_path):
    out = tmp_path / "r.json"
    r = run_script("reward_ensemble_cost.py", "--preset", "tiny", "--labels", "16", "--members", "2", "--reps", "1",
                   "--threads", "1", "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["members"] == 2 and len(res["seconds"]["1"]) == len(res["seconds"]["2"]) == 1
    assert res["ratio"] == pytest.approx(res["median_2"] / res["median_1"]) and res["cpu"]
    assert "K=2 vs K=1" in r.stdout


@pytest.mark.heavy
def test_scaling_runs_without_a_launcher_and_under_torchrun_with_two_processes(tmp_path):
    out = tmp_path / "r.json"
    r = run_script("scaling.py", "--models", "tiny", "--parallel", "ddp", "--no-launcher-threads", "1", "--batch", "8",
                   "--updates", "2", "--json", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["updates"] == 2 and list(res["models"]) == ["tiny"]
    tiny = res["models"]["tiny"]
    (figures,) = tiny["reps"]
    assert tiny["batch"] == 8 and [(f["processes"], f["launcher"], f["threads"]) for f in figures] == [
        (1, False, 1), (2, True, 1)]  # fmt: skip
    assert all(f["episodes_per_s"] > 0 for f in figures) and figures[0]["ratio"] == 1.0
    assert math.isclose(figures[1]["ratio"], figures[1]["episodes_per_s"] / figures[0]["episodes_per_s"])
    assert re.search(r"2 processes x 1 thread ddp +[\d.]+ episodes/s \([\d.]+x\)", r.stdout), r.stdout


ROOFLINE_STAGES = ["assets and model", "evaluate initial", "sample and label", "train reward model", "PPO",
                   "evaluate final"]  # fmt: skip


@pytest.mark.heavy
def test_roofline_counts_each_stage_as_flop_counter_mode_does(tmp_path):
    """The tiny quickstart with LoRA in its top block (the frozen block below runs in the sampling passes, which keep
    its outputs for the reward model's epochs and held-out labels and for each PPO batch's forwards), some labels
    held out, two epochs and two PPO updates: each stage's analytic FLOPs against torch's
    FlopCounterMode counting the same stage of the same run (both count matmuls only, so they agree exactly), and a
    table of finite figures for every stage."""
    out = tmp_path / "r.json"
    r = run_script("roofline.py", "--preset", "tiny", "--labels", "8", "--updates", "2", "--eval-queries", "4",
                   "--peak-size", "128", "--peak-reps", "2", "--count-flops", "--json", str(out), "--lora.rank", "4",
                   "--lora.layers", "1", "--train-reward.epochs", "2", "--labels.heldout-fraction", "0.3",
                   "--run.report-to", "")  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    stages = {s["stage"]: s for s in res["stages"]}
    assert list(stages) == ROOFLINE_STAGES and res["dtype"] == "float32" and res["threads"] == 1
    assert res["fp32_linear"] in ("onednn", "torch")  # which kernels the run's fp32 layers took
    assert stages["assets and model"]["flops"] == stages["assets and model"]["counted_flops"] == 0
    for name in ROOFLINE_STAGES[1:]:
        st = stages[name]
        assert st["flops"] > 0 and math.isclose(st["flops"], st["counted_flops"], rel_tol=0.01), (name, st)
        assert st["seconds"] > 0 and math.isclose(st["floor_s"], st["gflop"] / res["peak"]["gflop_per_s"])
    rm, ppo = stages["train reward model"]["parts_gflop"], stages["PPO"]["parts_gflop"]
    assert rm["held-out evaluation"] > 0 and rm["training"] > 0
    assert "frozen prefix, once" not in rm and "rollout: frozen prefix" not in ppo  # the sampling passes kept them
    assert res["total"]["flops"] == sum(s["flops"] for s in stages.values()) and res["peak_rss_mib"] > 0
    rss = [stages[name]["peak_rss_mib"] for name in ROOFLINE_STAGES]  # the child's peak so far at each stage's end
    assert 0 < rss[0] and rss == sorted(rss) and rss[-1] <= res["total"]["peak_rss_mib"] == res["peak_rss_mib"]
    for name in [*ROOFLINE_STAGES, "total"]:  # seconds, GFLOP, GFLOP/s, peak, %, floor, peak RSS, counted, ratio
        row = re.search(rf"^{re.escape(name)}  +(.+)$", r.stdout, re.M)
        assert row, r.stdout
        cells = [float(x) for x in row.group(1).split()]
        assert len(cells) == 9 and all(math.isfinite(x) for x in cells), row.group(0)
    assert re.search(r"^peak RSS of the run: \d+ MiB", r.stdout, re.M), r.stdout
    assert "[5/6] PPO against the reward model" in r.stdout  # the quickstart's own progress passes through


def test_roofline_refuses_a_model_it_cannot_count_before_running_it(tmp_path, capsys, monkeypatch):
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    mod = _script("roofline", monkeypatch)
    code = mod.run_main(lambda: mod.main(["--task.initial-model", str(tmp_path / "bert")]))
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (out, err)
    assert "model_type 'bert': the FLOP count knows GPT-2 and Llama-style models" in err


def _script(name: str, monkeypatch):
    """A benchmark script imported as a module (its folder on sys.path, for _common), to call main(argv)."""
    import importlib.util

    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA these flags are good: the script would run")
BAD_FLAGS = [
    # (script, argv, text the one line must contain)
    ("ppo_throughput", ["--steps", "1"], "--steps must be at least 2"),
    ("ppo_throughput", ["--steps", "two"], "argument --steps: not an integer: 'two'"),
    (
        "ppo_throughput",
        ["--batch-size", "6", "--minibatches", "4"],
        "--batch-size 6 is not a multiple of --minibatches",
    ),
    ("ppo_throughput", ["--modes", "shared,both"], "--modes: a comma-separated list of shared, separate"),
    ("ppo_throughput", ["--lr", "-1"], "--lr must be positive"),
    ("ppo_throughput", ["--anchor-result", "{anchor}"], "was measured with batch_size 4, this run uses 64"),
    ("ppo_throughput", ["--anchor-result", "{tmp}/missing.json"], "cannot read"),
    (
        "ppo_throughput",
        ["--anchor-result", "{anchor}", "--batch-size", "4", "--dtype", "bfloat16"],
        "was measured with bf16 False, this run uses --dtype bfloat16",
    ),
    ("ppo_throughput", ["--anchor-python", "{tmp}/no-venv/python"], "not found: create the TRL venv"),
    ("gpu_throughput", ["--device", "tpu"], "--device 'tpu': choose auto, cpu, cuda or cuda:N"),
    ("gpu_throughput", ["--batch", "6", "--nminibatches", "4"], "--batch 6 is not a multiple of --nminibatches 4"),
    ("gpu_throughput", ["--updates", "0"], "argument --updates: must be at least 1, not 0"),
    pytest.param("gpu_throughput", ["--device", "cuda"], "CUDA is not available", marks=NO_CUDA),
    ("gpu_kernels", ["--reps", "3"], "unrecognized arguments: --reps 3"),
    ("best_of_n_sampling", ["--n", "0"], "argument --n: must be at least 1, not 0"),
    ("best_of_n_sampling", ["--device", "gpu"], "--device 'gpu': choose cpu, cuda or cuda:N"),
    pytest.param("best_of_n_sampling", ["--device", "cuda"], "CUDA is not available", marks=NO_CUDA),
    ("lora_vs_peft", ["--reps", "0"], "argument --reps: must be at least 1, not 0"),
    ("cpu_attention", ["--shapes", "2:9:8:fwd"], "--shapes '2:9:8:fwd': positive sizes, QUERY_LEN <= KEY_LEN"),
    ("cpu_attention", ["--heads", "4:3:8"], "--heads '4:3:8': QUERY_HEADS:KV_HEADS:HEAD_DIM"),
    ("reward_accuracy", ["--labels", "4,x"], "--labels '4,x': comma-separated positive integers"),
    ("reward_accuracy", ["--labeler", "faithfulness"], "argument --labeler: invalid choice: 'faithfulness'"),
    ("reward_accuracy", ["--store", "{tmp}/labels.sqlite"], "no such file"),
    ("reward_accuracy", ["--preset", "huge"], "argument --preset: invalid choice: 'huge'"),
    ("reward_ensemble_cost", ["--members", "1"], "argument --members: must be at least 2, not 1"),
    ("reward_ensemble_cost", ["--preset", "huge"], "argument --preset: invalid choice: 'huge'"),
    ("scaling", ["--updates", "1"], "argument --updates: must be at least 2, not 1"),
    ("scaling", ["--models", "tiny,huge"], "--models: unknown model 'huge'"),
    ("scaling", ["--parallel", "zero"], "--parallel: unknown value 'zero'"),
    ("scaling", ["--batch", "6", "--models", "tiny"], "--batch 6: tiny runs 4 minibatches"),
    ("scaling", ["--no-launcher-threads", "0"], "--no-launcher-threads '0'"),
    pytest.param("scaling", ["--device", "cuda"], "CUDA is not available", marks=NO_CUDA),
    # docs/benchmarks.md's quick check: the defaults' 76 + 32 tokens pass the tiny GPT-2's 64 positions
    ("best_of_n_sampling", ["--model", "tiny-gpt2"], "--query-len 76 + --response-len 32 = 108 tokens: tiny-gpt2"),
    ("roofline", ["--full", "--labels", "10"], "--full runs the preset as it is: drop --labels"),
    ("roofline", ["--updates", "0"], "argument --updates: must be at least 1, not 0"),
    ("roofline", ["--eval-queries", "1"], "--eval-queries must be at least 2"),
    ("roofline", ["--preset", "huge"], "unknown preset 'huge'"),
    ("roofline", ["--ppo.nope", "1"], "ppo.nope"),
    ("roofline", ["--ppo.lr"], "--ppo.lr needs a value"),
    ("roofline", ["--run-dir", "{tmp}"], "not empty; name a new directory"),
    pytest.param("roofline", ["--run.device", "cuda"], "CUDA is not available", marks=NO_CUDA),
]


@pytest.mark.parametrize(("script", "argv", "needle"), BAD_FLAGS)
def test_bad_flags_are_one_line_and_exit_2(script, argv, needle, tmp_path, capsys, monkeypatch):
    anchor = {"episodes_per_sec": 8.0, "sec_per_step_mean": {"total_s": 8.0}, "per_step": [],
              "config": {"batch_size": 4, "query_len": 32, "response_len": 24, "ppo_epochs": 4, "minibatches": 4,
                         "temperature": 0.7}}  # fmt: skip
    (tmp_path / "anchor.json").write_text(json.dumps(anchor))
    argv = [a.format(tmp=tmp_path, anchor=tmp_path / "anchor.json") for a in argv]
    if script == "ppo_throughput":
        argv += ["--out-dir", str(tmp_path / "out")]
    mod = _script(script, monkeypatch)
    try:
        code = mod.run_main(lambda: mod.main(argv)) if hasattr(mod, "run_main") else mod.main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2, f"exit {code}; stderr: {err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and out == "", (out, err)
    assert "error:" in lines[0] and needle in lines[0], lines[0]
    assert not (tmp_path / "out").exists(), "a refused run wrote its output folder"


def test_the_gpu_kit_refuses_in_one_line_where_it_cannot_run(tmp_path):
    """scripts/gpu_kit.sh runs its parts only on a GPU and after `pack`: elsewhere one line and exit 2, nothing run."""
    (tmp_path / "scripts").mkdir()
    kit = tmp_path / "scripts" / "gpu_kit.sh"
    kit.write_text((ROOT / "scripts" / "gpu_kit.sh").read_text())
    env = {**os.environ, "OUT": str(tmp_path / "out")}

    def run(*args):
        r = subprocess.run(["bash", str(kit), *args], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        return line

    assert run().startswith("usage: bash scripts/gpu_kit.sh pack | bench | tests | all")
    assert "'speed'" in run("speed")
    assert "run 'bash scripts/gpu_kit.sh pack' first" in run("bench")
    if not torch.cuda.is_available():
        (tmp_path / ".gpu" / "wheels").mkdir(parents=True)
        assert "no CUDA device" in run("all")
    assert not (tmp_path / "out").exists()
