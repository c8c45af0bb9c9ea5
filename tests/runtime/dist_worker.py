"""Run by tests/runtime/test_distributed.py: the steps of a JSON plan (argv[1]) under one launch of several ranks,
one step after another in the same processes, so that one launch's start (the launcher, a torch import per rank, the
rendezvous: seconds each) serves several tests. Each step is either

- `worker`: one reward-model epoch and one PPO update on fixed data, each rank on its share, with run.parallel ddp
  then fsdp; then the quickstart's held-out evaluation of a few queries. Rank 0 saves the final (whole) parameters,
  the reduced metrics and every rank's evaluation to the step's `out`. The data are built identically on every rank
  from fixed seeds. `run_worker` runs the same in one plain process (no launcher, no group): the reference.
- `cli`: `lmprefs ARGV` as `python -m lmprefs` runs it (lmprefs.cli.main), with the step's environment variables
  set for it; `kill_at` POINT@K stops it by an exception at the K-th arrival at that crash point on every rank (as
  tests/training/test_crash_safety.py does in one process); `copy` [SRC, DST]: rank 0 then copies directory SRC to DST.

Each rank writes `STEP.rankR.json` into the plan's `dir`: the return code (or "killed", or a traceback), and what
the step printed. The first step joins the launcher's own store, exactly as a command launched alone does. lmprefs
destroys its process group at the end of each command, and a default group made again in the same process reuses
the first one's store keys (torch restarts their numbering), so each later step gets a fresh store: rank 0 serves it
on the step's own port (`port`, picked by the test), TORCHELASTIC_USE_AGENT_STORE=False.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import os
import resource
import shutil
import sys
import time
import traceback
from pathlib import Path

import torch

from lmprefs.config import preset
from lmprefs.data.tasks import TaskContext, format_queries
from lmprefs.labels.types import get as get_label_type
from lmprefs.models import parallel
from lmprefs.models.loading import load_lm
from lmprefs.models.policy import Policy
from lmprefs.models.reward_model import RewardModel
from lmprefs.runtime import distributed as dist
from lmprefs.training.comparisons import Comparisons
from lmprefs.training.optim import TFAdam
from lmprefs.training.ppo import Rollout, kl_penalized_rewards, ppo_update
from lmprefs.training.reward import train_epoch

R = dataclasses.replace
N, S, B = 12, 4, 8  # labeled questions, samples per question, PPO episodes (global)


def whole(module) -> dict | None:
    """The module's parameters, gathered whole on rank 0 under FSDP (None on the other ranks)."""
    state = parallel.full_state_dict(module)
    return None if state is None else {k: v.detach().clone() for k, v in state.items()}


def moved(before: dict, after: dict | None) -> float:
    return 0.0 if after is None else max((after[k] - before[k]).abs().max().item() for k in after)


def reward_epoch(cfg, model, tok):
    g = torch.Generator().manual_seed(0)
    T, Q = cfg.task.response_length, cfg.task.query_length
    data = Comparisons(torch.randint(0, 1000, (N, Q), generator=g), torch.randint(0, 1000, (N, S, T), generator=g),
                       torch.randint(0, S, (N,), generator=g), torch.arange(N))  # fmt: skip
    # a global batch of 8 in microbatches of 2 (DDP's no_sync path), then a last batch of 4
    cfg = R(cfg, train_reward=R(cfg.train_reward, batch_size=8, microbatch=2, epochs=2))
    rm = RewardModel(copy.deepcopy(model), tok, seed=1)
    rm.lm.requires_grad_(True)
    before = {k: v.detach().clone() for k, v in rm.state_dict().items()}
    ctx = TaskContext([], [], torch.device("cpu"), torch.float32)
    stats = train_epoch(rm, data, get_label_type("best_of_4"), cfg, ctx)
    after = whole(rm)
    return after, stats | {"moved": moved(before, after)}


def ppo_step(cfg, model, tok):
    """A given rollout of B episodes; its second half repeats the first half's rewards and values (not its tokens),
    so each rank's per-minibatch whitening (the original's) uses the same moments as one process on the whole."""
    g = torch.Generator().manual_seed(1)
    T = cfg.task.response_length
    policy = Policy(copy.deepcopy(model), tok, cfg.task.temperature)
    queries = format_queries(torch.randint(0, 1000, (B, cfg.task.query_length), generator=g), [], [])
    responses = torch.randint(0, 1000, (B, T), generator=g)
    with torch.no_grad():
        logprobs, _, _ = policy(queries, responses)
    ref = logprobs - 0.1 * torch.rand(B, T, generator=g)
    values = torch.randn(B, T, generator=g)
    scores = torch.randn(B, generator=g)
    values[B // 2 :], scores[B // 2 :] = values[: B // 2], scores[: B // 2]
    ref[B // 2 :] = ref[: B // 2] + (logprobs[B // 2 :] - logprobs[: B // 2])  # the same KL, so the same rewards
    rewards, _, _ = kl_penalized_rewards(logprobs, ref, scores, 0.15)
    rollout = Rollout(queries, responses, logprobs, ref, values, scores, rewards)
    part = B // dist.world()
    mine = rollout[slice(dist.rank() * part, (dist.rank() + 1) * part)]
    ppo_cfg = R(cfg.ppo, nminibatches=1, noptepochs=2, lr=1e-3)
    before = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    model_ = parallel.wrap(policy, cfg.run.parallel)  # FSDP shards in place: the optimizer comes after
    opt = TFAdam(policy.trainable_parameters(), lr=ppo_cfg.lr)
    stats = ppo_update(lambda mb: model_(mb.queries, mb.responses), opt, mine, ppo_cfg,
                       torch.Generator().manual_seed(2), reduce=dist.all_reduce_mean)  # fmt: skip
    after = whole(policy)
    return after, stats | {"moved": moved(before, after)}


def heldout_eval(cfg, model, tok) -> dict:
    """The quickstart's evaluation of 7 held-out queries (an odd number: the ranks hold unequal shares)."""
    from lmprefs.labels.labelers import SCORE_FNS
    from lmprefs.pipeline.evaluation import evaluate_policy
    from lmprefs.pipeline.task import Task

    none = torch.empty(0, 0, dtype=torch.long)
    t = Task(cfg, torch.device("cpu"), torch.float32, model, tok, none, none, [], [])
    queries = torch.randint(0, 1000, (7, cfg.task.query_length), generator=torch.Generator().manual_seed(3))
    out = evaluate_policy(t, queries, SCORE_FNS["vader"], None, 2, seed=4, ref_model=model)
    return {k: out[k] for k in ("mean", "stderr", "n_queries", "texts", "kl")}


def run_worker(out: str, modes: tuple[str, ...] = ("ddp", "fsdp")) -> None:
    dist.init()
    torch.manual_seed(0)
    model, tok = load_lm("tiny-gpt2")
    results = {}
    for mode in modes:  # every mode from the same initial model (each step deep-copies it)
        cfg = preset("tiny")
        cfg = R(cfg, run=R(cfg.run, parallel=mode))
        rm_params, rm_stats = reward_epoch(cfg, model, tok)
        pol_params, pol_stats = ppo_step(cfg, model, tok)
        results[mode] = {"rm": rm_params, "rm_stats": rm_stats, "policy": pol_params, "ppo_stats": pol_stats}
    evals = dist.all_gather_objects(heldout_eval(preset("tiny"), model, tok))
    if dist.is_main():
        torch.save({"modes": results, "evals": evals, "world": dist.world()}, out)
    dist.teardown()


class Killed(BaseException):
    """Raised at a crash point; nothing in lmprefs catches it (its `finally` blocks run: the group is destroyed)."""


def _cli(step: dict):
    from lmprefs.cli import main as lmprefs_main
    from lmprefs.io import atomic

    point, _, nth = (step.get("kill_at") or "").partition("@")
    hits = []

    def hook(at: str) -> None:
        if at == point:
            hits.append(at)
            if len(hits) >= int(nth or 1):
                raise Killed(at)

    atomic.crash_hook = hook if point else None
    try:
        return lmprefs_main(step["argv"])
    except Killed:
        return "killed"
    finally:
        atomic.crash_hook = None


def run_step(step: dict, first: bool):
    env = dict(step.get("env", {}))
    if not first:
        env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(step["port"]), "TORCHELASTIC_USE_AGENT_STORE": "False"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if step["kind"] == "worker":
                run_worker(step["out"])
                rc = 0
            else:
                rc = _cli(step)
        if step.get("copy") and os.environ["RANK"] == "0":  # the directory as the step left it, for the test to see
            shutil.copytree(*step["copy"], symlinks=True)
    except Exception:  # recorded for the test that reads this step; the next steps still run
        rc = "error: " + traceback.format_exc()
        dist.teardown()
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    return {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def main(plan_file: str) -> None:
    plan = json.loads(Path(plan_file).read_text())
    d, r = Path(plan["dir"]), os.environ["RANK"]
    for i, step in enumerate(plan["steps"]):
        t0, c0 = time.time(), _cpu_seconds()
        record = run_step(step, first=i == 0) | {"seconds": time.time() - t0, "cpu_s": _cpu_seconds() - c0}
        (d / f"{step['name']}.rank{r}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(*sys.argv[1:])
    # as the `lmprefs` entry point ends a launched rank: without the interpreter's finalization, which gloo's worker
    # threads, alive after the steps' process groups are destroyed, can crash after the work is done
    from lmprefs.cli.dispatch import _end_rank

    _end_rank(0)
