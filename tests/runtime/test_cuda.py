"""GPU correctness. Tests marked `cuda` skip without CUDA, so the CPU suite passes; on a GPU machine run
`python3 -m pytest -q -m cuda`. The one CPU test here pins the bf16 tolerance the CUDA comparison uses: bf16
autocast against fp32 on the CPU must stay inside it too.

The bf16 tolerance of one PPO update (2 epochs, one minibatch, tiny GPT-2) against the fp32 CPU update:
every loss/statistic within 0.05 + 5% of its fp32 value, and the parameter change of the update pointing the same
way (cosine similarity of the flattened deltas >= 0.95).
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from lmprefs.cli.dispatch import main
from lmprefs.config import preset
from lmprefs.io.jsonl import read_jsonl
from lmprefs.pipeline.policy import policy_for
from lmprefs.pipeline.task import setup_task
from lmprefs.runtime.device import autocast
from lmprefs.training.ppo import Rollout, kl_penalized_rewards, ppo_update

R = dataclasses.replace
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
STAT_ATOL, STAT_RTOL, MIN_COSINE = 0.05, 0.05, 0.95


def _rollout_and_policy(device):
    """A fixed rollout (sampled on the CPU, fp32) and a fresh tiny policy, both on `device`."""
    cfg = preset("tiny")
    cfg = R(cfg, ppo=R(cfg.ppo, nminibatches=1, noptepochs=2, batch_size=16))
    t = setup_task(cfg, n_heldout=8)
    policy = policy_for(t)
    torch.manual_seed(0)
    B, T = 16, cfg.task.response_length
    queries = t.train_queries[:B]
    responses = torch.randint(0, len(t.tok), (B, T))
    with torch.no_grad():
        logprobs, values, _ = policy(queries, responses)
        ref = logprobs + 0.05 * torch.randn(B, T)
    scores = torch.randn(B)
    rewards, _, _ = kl_penalized_rewards(logprobs, ref, scores, 0.1)
    rollout = Rollout(queries, responses, logprobs, ref, values, scores, rewards)
    fields = [f.name for f in dataclasses.fields(rollout) if f.name != "prefix"]
    move = {k: v.to(device) for k in fields if (v := getattr(rollout, k)) is not None}  # PPO's rollout: no advantages
    return cfg, policy.to(device), Rollout(**move)


def _one_update(device: str, dtype: torch.dtype):
    """(stats, flattened parameter change) of one ppo_update on `device` under `dtype` autocast."""
    from lmprefs.training.optim import TFAdam

    cfg, policy, rollout = _rollout_and_policy(torch.device(device))
    params = policy.trainable_parameters()
    before = torch.cat([p.detach().flatten().cpu().clone() for p in params])
    opt = TFAdam(params, lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(0)
    policy.train()
    stats = ppo_update(lambda mb: policy(mb.queries, mb.responses), opt, rollout, cfg.ppo, gen,
                       autocast=lambda: autocast(torch.device(device), dtype))  # fmt: skip
    after = torch.cat([p.detach().flatten().cpu() for p in params])
    return stats, (after - before).double()


def _assert_within_bf16_tolerance(stats, delta, ref_stats, ref_delta):
    for k, v in ref_stats.items():
        if math.isfinite(v):
            assert abs(stats[k] - v) <= STAT_ATOL + STAT_RTOL * abs(v), (k, stats[k], v)
    cos = torch.nn.functional.cosine_similarity(delta, ref_delta, dim=0).item()
    assert cos >= MIN_COSINE, cos


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, cuda])])
def test_bf16_update_is_within_the_stated_tolerance_of_the_cpu_fp32_update(device):
    ref_stats, ref_delta = _one_update("cpu", torch.float32)
    stats, delta = _one_update(device, torch.bfloat16)
    _assert_within_bf16_tolerance(stats, delta, ref_stats, ref_delta)


@pytest.mark.cuda
@cuda
def test_compiled_training_forward_update_matches_eager():
    """run.compile (auto: on CUDA) compiles the PPO training forward; one bf16 update through it stays within the
    bf16 tolerance of the eager fp32 CPU update, like the eager bf16 update does."""
    from lmprefs.training.optim import TFAdam
    from lmprefs.training.policy import training_forward

    ref_stats, ref_delta = _one_update("cpu", torch.float32)
    cfg, policy, rollout = _rollout_and_policy(torch.device("cuda"))
    params = policy.trainable_parameters()
    before = torch.cat([p.detach().flatten().cpu().clone() for p in params])
    opt = TFAdam(params, lr=1e-3)
    gen = torch.Generator(device="cuda").manual_seed(0)
    policy.train()
    forward = training_forward(policy, "on", torch.device("cuda"))
    stats = ppo_update(forward, opt, rollout, cfg.ppo, gen,
                       autocast=lambda: autocast(torch.device("cuda"), torch.bfloat16))  # fmt: skip
    delta = (torch.cat([p.detach().flatten().cpu() for p in params]) - before).double()
    _assert_within_bf16_tolerance(stats, delta, ref_stats, ref_delta)


@pytest.mark.cuda
@cuda
def test_no_host_sync_inside_the_ppo_minibatch_loop():
    """Only the stats' one .tolist() at the end of an update may synchronise with the host."""
    cfg, policy, rollout = _rollout_and_policy(torch.device("cuda"))
    cfg = R(cfg, ppo=R(cfg.ppo, nminibatches=4, noptepochs=2))
    from lmprefs.training.optim import TFAdam

    opt = TFAdam(policy.trainable_parameters(), lr=1e-3)
    gen = torch.Generator(device="cuda").manual_seed(0)
    fwd = lambda mb: policy(mb.queries, mb.responses)  # noqa: E731
    ppo_update(fwd, opt, rollout, cfg.ppo, gen, autocast=lambda: autocast(torch.device("cuda"), torch.bfloat16))
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            ppo_update(fwd, opt, rollout, cfg.ppo, gen,
                       autocast=lambda: autocast(torch.device("cuda"), torch.bfloat16))  # fmt: skip
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # the first warning is the debug mode's own notice ("...is a prototype feature..."), not a synchronisation
    syncs = [str(w.message) for w in caught if "called a synchronizing" in str(w.message)]
    assert len(syncs) <= 1, syncs


@pytest.mark.cuda
@cuda
def test_compiled_reference_and_reward_model_forwards_match_eager():
    """run.compile (auto: on CUDA) compiles a rollout's reference logprobs and reward-model scores; under bf16
    autocast they match the eager forwards within bf16 rounding, on padded queries and truncated responses."""
    from lmprefs.data.tasks import PAD
    from lmprefs.models.loading import load_lm
    from lmprefs.models.reward_model import RewardModel
    from lmprefs.training.rollout import ref_logprobs, rm_score_fn

    model, tok = load_lm("tiny-gpt2", "cuda")
    rm = RewardModel(load_lm("tiny-gpt2", "cuda")[0], tok, seed=0).cuda().freeze().eval()
    g = torch.Generator().manual_seed(0)
    q, r = torch.randint(0, len(tok), (16, 12), generator=g), torch.randint(0, len(tok), (16, 8), generator=g)
    q[0, :3], r[1, 5:] = PAD, PAD
    q, r = q.cuda(), r.cuda()
    with torch.no_grad(), autocast(torch.device("cuda"), torch.bfloat16):
        lps = [ref_logprobs(model, q, r, 0.7, len(tok), compile=c) for c in (False, True)]
        scores = [rm_score_fn(rm, compile=c)(q, r) for c in (False, True)]
    torch.testing.assert_close(lps[1], lps[0], atol=STAT_ATOL, rtol=STAT_RTOL)
    torch.testing.assert_close(scores[1], scores[0], atol=STAT_ATOL, rtol=STAT_RTOL)


@pytest.mark.cuda
@cuda
def test_sampler_static_compiled_on_cuda_matches_the_dynamic_cache():
    from lmprefs.data.tasks import PAD
    from lmprefs.models.loading import load_lm
    from lmprefs.models.sampling import sample

    model, tok = load_lm("tiny-gpt2", "cuda")
    q = torch.randint(0, len(tok), (8, 12), device="cuda")
    q[0, :3] = PAD
    q[1, -4:] = PAD
    runs = {}
    for cache, comp in [("dynamic", "off"), ("static", "off"), ("static", "on"), ("static", "on")]:
        gen = torch.Generator(device="cuda").manual_seed(3)
        runs[(cache, comp)] = sample(model, q, 10, 0.7, len(tok), gen, cache=cache, compile=comp)
    base = runs[("dynamic", "off")]
    for r, lp in runs.values():
        assert r.equal(base[0])
        assert torch.allclose(lp, base[1], atol=1e-4)


@pytest.mark.cuda
@cuda
def test_padded_lm_head_on_cuda_gives_the_heads_logits_and_gradients():
    """lm_logits pads GPT-2's 50257-row head to 50304 on CUDA (a faster cuBLAS kernel): the first 50257 logits and
    the weight's gradient are the plain head's, in fp32 and under bf16 autocast."""
    from lmprefs.models.loading import load_lm
    from lmprefs.models.trunk import lm_head, lm_logits

    model, tok = load_lm("tiny-gpt2", "cuda")
    h = torch.randn(6, 24, lm_head(model).in_features, device="cuda")
    for dtype in (torch.float32, torch.bfloat16):
        grads = []
        for fn in (lambda x: lm_head(model)(x), lambda x: lm_logits(model, x)[..., : len(tok)]):
            model.zero_grad()
            with autocast(torch.device("cuda"), dtype):
                out = fn(h)
            out.float().square().mean().backward()
            grads.append((out.float(), lm_head(model).weight.grad.clone()))
        (a, ga), (b, gb) = grads
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        assert ((a - b).norm() / a.norm()).item() < tol and ((ga - gb).norm() / ga.norm()).item() < tol


@pytest.mark.cuda
@cuda
def test_tiny_quickstart_on_cuda(tmp_path):
    import json

    run_dir = tmp_path / "qs"
    assert main(["quickstart", "--preset", "tiny", "--run-dir", str(run_dir), "--eval-queries", "16",
                 "--run.device", "cuda"]) == 0  # fmt: skip
    rep = json.loads((run_dir / "report.json").read_text())
    assert all(math.isfinite(v) for v in rep["true_reward_after"].values())


@pytest.mark.cuda
@cuda
def test_kill_and_resume_on_cuda(tmp_path):
    """A killed CUDA run resumes to the end; its metrics match the uninterrupted run's within bf16 noise (CUDA
    kernels, e.g. attention's backward, are not bitwise deterministic, so no bitwise claim is made)."""
    args = ["train-policy", "tiny", "--reward", "vader", "--ppo.total-episodes", str(16 * 8), "--run.save-interval",
            "2", "--run.log-interval", "100", "--run.device", "cuda"]  # fmt: skip
    cmd, env = [sys.executable, "-m", "lmprefs"], dict(os.environ)
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(cmd + args + ["--run-dir", str(full)], check=True, env=env, capture_output=True)
    p = subprocess.Popen(cmd + args + ["--run-dir", str(killed)], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        m = killed / "metrics.jsonl"
        if m.exists() and len(m.read_text().splitlines()) >= 3:
            os.kill(p.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    p.wait()
    assert p.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    r = subprocess.run(cmd + ["train-policy", "tiny", "--resume", "--run-dir", str(killed)], env=env,
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = read_jsonl(full / "metrics.jsonl"), read_jsonl(killed / "metrics.jsonl")
    assert [x["step"] for x in a] == [x["step"] for x in b]
    for x, y in zip(a, b, strict=True):
        assert abs(x["objective/score"] - y["objective/score"]) <= 0.1 + 0.1 * abs(x["objective/score"])


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_torchrun_world_size_one_on_nccl(tmp_path, parallel):
    """torchrun --nproc-per-node 1 on a GPU: the group is NCCL on cuda:0, train-policy runs under DDP or FSDP2 (the
    policy's blocks "sharded" over one rank: the same hooks, gathers and whole-state checkpoints), stops after the
    checkpoint of update 2 (exit 9, as kill -9) and resumes to the end; its metrics match an uninterrupted run's
    within bf16 noise (no bitwise claim on CUDA)."""
    from lmprefs.runtime.ports import free_port

    port = free_port()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
                "--master-port", str(port)]  # fmt: skip
    root = str(Path(__file__).resolve().parents[2])  # this checkout first, the machine's own PYTHONPATH after it
    path = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "LMPREFS_DIST_TIMEOUT": "120", "PYTHONPATH": path}
    probe = ("from lmprefs.runtime import distributed as d; d.init(); import torch.distributed as t; "
             "print(t.get_backend())")
    r = subprocess.run([*torchrun, "--no-python", sys.executable, "-c", probe], env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0 and r.stdout.split()[-1] == "nccl", r.stderr[-2000:]
    args = ["-m", "lmprefs", "train-policy", "tiny", "--reward", "vader", "--ppo.total-episodes", str(16 * 4),
            "--run.save-interval", "2", "--run.log-interval", "100", "--run.device", "cuda", "--run.parallel",
            parallel]  # fmt: skip
    full, stopped = tmp_path / "full", tmp_path / "stopped"
    r = subprocess.run([*torchrun, *args, "--run-dir", str(full)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert torch.load(full / "checkpoint" / "ranks.pt", weights_only=False)["world_size"] == 1
    r = subprocess.run([*torchrun, *args, "--run-dir", str(stopped)], env={**env, "LMPREFS_CRASH_AT": "train:saved"},
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode != 0 and len(read_jsonl(stopped / "metrics.jsonl")) == 2, r.stderr[-3000:]
    r = subprocess.run([*torchrun, "-m", "lmprefs", "train-policy", "tiny", "--resume", "--run-dir", str(stopped)],
                       env=env, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = read_jsonl(full / "metrics.jsonl"), read_jsonl(stopped / "metrics.jsonl")
    assert [x["step"] for x in a] == [x["step"] for x in b] == [1, 2, 3, 4]
    for x, y in zip(a, b, strict=True):
        assert math.isfinite(y["objective/kl"])
        assert abs(x["objective/score"] - y["objective/score"]) <= 0.1 + 0.1 * abs(x["objective/score"])
    assert (stopped / "policy" / "model.safetensors").is_file()
