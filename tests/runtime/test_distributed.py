"""Several ranks on CPU with gloo, started by torchrun and by accelerate launch: equality of 2-rank and 1-rank
updates, rank 0 alone writing, a 2-"node" rendezvous on loopback, kill -9 of one rank and exact resume.

Two launches serve every test here (each launch costs seconds before any work): a run killed mid-way (`killed`), and
one 2-node launch of tests/runtime/dist_worker.py that runs the other multi-rank steps in turn (`launch`), each test
asserting on its own steps."""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from lmprefs.cli.dispatch import main
from lmprefs.io.jsonl import read_jsonl
from lmprefs.runtime.ports import free_port, free_ports

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# this checkout first on PYTHONPATH, with whatever the machine has there after it (packages may live there)
PYTHONPATH = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHONPATH, "LMPREFS_DIST_TIMEOUT": "60"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# 5 updates of 16 episodes (8 per rank), a checkpoint every 2; VADER as the reward (the reward model's training under
# two ranks is checked by the equality test, and costs more)
ARGS = ["train-policy", "tiny", "--reward", "vader", "--ppo.total-episodes", "80", "--run.save-interval", "2",
        "--run.log-interval", "100"]  # fmt: skip


def _env(d: Path) -> dict[str, str]:
    """ENV with the launch's temporary files (torch elastic's log folders, one per launch) under d, not /tmp."""
    tmp = d / "tmp"
    tmp.mkdir(exist_ok=True)
    return {**ENV, "TMPDIR": str(tmp)}


def _files(d: Path) -> list[str]:
    return sorted("events.out.tfevents" if p.name.startswith("events.out.tfevents") else str(p.relative_to(d))
                  for p in d.rglob("*") if p.is_file())  # fmt: skip


def _metrics(path: Path) -> list[dict]:
    keep = ("elapsed/updates", "elapsed/episodes")
    return [{k: v for k, v in r.items() if not k.startswith("elapsed/") or k in keep} for r in read_jsonl(path)]


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """The train-policy run of ARGS in one process (this one): the files a run writes."""
    d = tmp_path_factory.mktemp("one") / "run"
    assert main([*ARGS, "--run-dir", str(d)]) == 0
    return d


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """The train-policy run of ARGS on 2 ranks started by `accelerate launch` (which sets torchrun's variables; on a
    CPU through its --multi_gpu launcher, as docs/scale.md says: its --cpu path starts one process), rank 1 killed
    with SIGKILL mid-run, past the checkpoint of update 2; `saved` is a copy of its directory as the kill left it.
    Its resume runs in `launch`; test_kill_one_rank_fails_the_job_then_resume_matches asserts on both."""
    d = tmp_path_factory.mktemp("killed")
    run = d / "run"
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                  "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
                  str(free_port()), "-m", "lmprefs"]  # fmt: skip
    job = subprocess.Popen([*accelerate, *ARGS, "--run-dir", str(run)], env=_env(d), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline, victim = time.time() + 180, None
    while time.time() < deadline and job.poll() is None:
        m = run / "metrics.jsonl"
        if (run / "checkpoint" / "state.pt").exists() and m.exists() and len(m.read_text().splitlines()) >= 3:
            victim = next(c for c in psutil.Process(job.pid).children(recursive=True)
                          if c.environ().get("RANK") == "1")  # fmt: skip
            victim.send_signal(signal.SIGKILL)
            break
        time.sleep(0.05)
    t_kill = time.time()
    _, err = job.communicate(timeout=120)
    stopped_after = time.time() - t_kill
    if run.exists():
        shutil.copytree(run, d / "saved", symlinks=True)
    return {"dir": run, "saved": d / "saved", "victim": victim, "rc": job.returncode, "err": err,
            "stopped_after": stopped_after}  # fmt: skip


class Launch:
    """What one 2-rank launch of dist_worker.py recorded: `step(name)` is each rank's record of that step."""

    def __init__(self, d: Path):
        self.dir = d

    def step(self, name: str) -> list[dict]:
        return [json.loads((self.dir / f"{name}.rank{r}.json").read_text()) for r in range(2)]

    def rcs(self, name: str) -> list:
        return [r["rc"] for r in self.step(name)]


@pytest.fixture(scope="module")
def launch(tmp_path_factory, killed):
    """One launch as 2 "nodes" of one process each, rendezvousing on 127.0.0.1 (two torchrun launches with --nnodes
    2, each node's address the loopback, not its hostname, which may resolve to nothing), that runs in turn: the
    train-policy run of ARGS (`two`, the 2-rank reference), the DDP/FSDP worker, a 2-rank `label`, an FSDP
    train-policy run stopped after the checkpoint of update 4 and its resume, the same FSDP run uninterrupted, the
    resume of the killed run, and a run with a bad LMPREFS_DIST_TIMEOUT. Each launch costs
    seconds before any work (the launcher, a torch import per rank, the rendezvous); one launch serves every test
    below."""
    d = tmp_path_factory.mktemp("launch")

    def cli(name: str, *argv: str, **extra) -> dict:
        return {"name": name, "kind": "cli", "argv": list(argv), **extra}

    resume = ["train-policy", "tiny", "--resume", "--run-dir"]
    fsdp, stopped = str(d / "fsdp"), str(d / "fsdp-stopped")  # stopped: a copy of fsdp as the stop left it
    steps = [
        cli("two", *ARGS, "--run-dir", str(d / "two")),
        {"name": "worker", "kind": "worker", "out": str(d / "worker.pt")},
        cli("label", "label", "tiny", "--db", str(d / "labels.sqlite"), "--questions", "40"),
        cli("fsdp", *ARGS, "--run.parallel", "fsdp", "--run-dir", fsdp, kill_at="train:saved@2", copy=[fsdp, stopped]),
        cli("fsdp-resume", *resume, fsdp),
        cli("fsdp-whole", *ARGS, "--run.parallel", "fsdp", "--run-dir", str(d / "fsdp-whole")),
        cli("killed-resume", *resume, str(killed["dir"])),
        cli("bad-timeout", *ARGS, "--run-dir", str(d / "bad"), env={"LMPREFS_DIST_TIMEOUT": "soon"}),
    ]
    *ports, rendezvous = free_ports(len(steps) + 1)  # picked together: no two the same
    for step, port in zip(steps, ports, strict=True):
        step["port"] = port
    plan = d / "plan.json"
    plan.write_text(json.dumps({"dir": str(d), "steps": steps}))
    nodes = [subprocess.Popen([*TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                               "--rdzv-endpoint", f"127.0.0.1:{rendezvous}", "--rdzv-id", "lmprefs-test",
                               "--local-addr", "127.0.0.1",
                               str(HERE / "dist_worker.py"), str(plan)], env=_env(d), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=600) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], [e[-3000:] for _, e in outs]
    return Launch(d)


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory, launch):
    """The worker in this process (no group) and under the launch's 2 ranks with DDP then FSDP."""
    import dist_worker

    one = tmp_path_factory.mktemp("worker") / "one.pt"
    dist_worker.run_worker(str(one), ("ddp",))
    assert launch.rcs("worker") == [0, 0], launch.step("worker")
    a, b = torch.load(one), torch.load(launch.dir / "worker.pt")
    assert (a["world"], b["world"]) == (1, 2)
    return a, b


@pytest.mark.heavy
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_rank_reward_epoch_and_ppo_update_equal_one_rank(worker_results, parallel):
    """The same global batches: 2 ranks with DDP, or with FSDP2 (every block sharded over the 2 ranks, gathered
    whole on rank 0 afterwards), end with the 1-process parameters within 1e-5 (float32 sums in another order; seen:
    1.6e-7), and their reduced metrics agree within 1e-5 relative."""
    a, b = worker_results[0]["modes"]["ddp"], worker_results[1]["modes"][parallel]
    for part in ("rm", "policy"):
        assert sorted(b[part]) == sorted(a[part])  # the whole model, not a shard
        worst = max((a[part][k] - b[part][k]).abs().max().item() for k in a[part])
        assert worst < 1e-5, (part, worst)
    assert a["rm_stats"]["moved"] > 1e-3 and a["ppo_stats"]["moved"] > 1e-4  # the updates did something
    for stats in ("rm_stats", "ppo_stats"):
        for k, v in a[stats].items():
            assert b[stats][k] == pytest.approx(v, rel=1e-5, abs=1e-6), (stats, k)


@pytest.mark.heavy
def test_heldout_evaluation_is_shared_out_and_gathered(worker_results):
    """The quickstart's held-out evaluation under 2 ranks: each rank samples its share of the 7 queries, and both
    return the same figures over all 7 (not each its own repeat of the whole evaluation)."""
    (one,), (r0, r1) = worker_results[0]["evals"], worker_results[1]["evals"]
    assert r0 == r1
    assert one["n_queries"] == r0["n_queries"] == 7 and len(r0["texts"]) == 7
    assert all(math.isfinite(x) for x in (r0["mean"], r0["stderr"], r0["kl"]))


@pytest.mark.heavy
def test_label_store_written_once_by_rank_zero(launch):
    from lmprefs.labels.store import LabelStore

    assert launch.rcs("label") == [0, 0], launch.step("label")
    assert sum(r["stdout"].count("questions sampled") for r in launch.step("label")) == 1  # rank 0 alone reports
    counts = LabelStore(launch.dir / "labels.sqlite").table_counts()
    assert counts["items"] == 40 and counts["labels"] == 40, counts


@pytest.mark.heavy
def test_two_nodes_train_and_only_rank_zero_writes(launch, one):
    two = launch.dir / "two"
    assert launch.rcs("two") == [0, 0], launch.step("two")
    assert _files(two) == _files(one)  # the same files, once: rank 1 wrote none of its own
    rows = read_jsonl(two / "metrics.jsonl")
    assert [r["elapsed/episodes"] for r in rows] == [16 * i for i in range(1, 6)]
    assert all(abs(r["objective/kl"]) < 50 and -5 < r["objective/score"] < 5 for r in rows)
    assert torch.load(two / "checkpoint" / "ranks.pt", weights_only=False)["world_size"] == 2
    assert sum(r["stdout"].count("policy: ") + r["stderr"].count("policy: ") for r in launch.step("two")) == 1


@pytest.mark.heavy
def test_kill_one_rank_fails_the_job_then_resume_matches(killed, launch):
    assert killed["victim"] is not None, "the run finished before it could be killed"
    err = killed["err"]
    assert killed["rc"] != 0
    assert killed["stopped_after"] < 60  # the launcher's agent stops the other rank: no hang until the group timeout
    assert "Signal 9" in err or "SIGKILL" in err or "exitcode  : -9" in err, err[-2000:]
    assert len(read_jsonl(killed["saved"] / "metrics.jsonl")) < 5

    # another number of ranks is refused in one line; the same number continues exactly
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(killed["saved"])]) == 2
    assert launch.rcs("killed-resume") == [0, 0], launch.step("killed-resume")
    assert _metrics(killed["dir"] / "metrics.jsonl") == _metrics(launch.dir / "two" / "metrics.jsonl")


@pytest.mark.heavy
def test_fsdp_run_resumes_exactly_and_only_rank_zero_writes(launch, one):
    """train-policy under FSDP2 on 2 ranks, both stopped right after the checkpoint of update 4 (by an exception at
    that crash point, the process group destroyed), then resumed on 2 ranks: its metrics and final policy, gathered
    whole on rank 0, are bitwise those of the same run uninterrupted, and the files are those of the 1-process run.
    Its first update equals the 2-rank DDP run's within fp32 rounding (the same math: DDP runs its top block at the
    read positions alone, FSDP's sharded block runs whole; measured 2e-6 apart at most). The later ones are not
    compared: where the CPU's GEMM rounds by the row count (MKL's AVX2 kernels), that rounding can change a sampled
    token, and the runs part (seen: KL 0.132 against 0.095 by update 4)."""
    from safetensors.torch import load_file

    d, whole, two = launch.dir / "fsdp", launch.dir / "fsdp-whole", launch.dir / "two"
    assert launch.rcs("fsdp") == ["killed", "killed"], launch.step("fsdp")
    assert len(read_jsonl(launch.dir / "fsdp-stopped" / "metrics.jsonl")) == 4
    assert launch.rcs("fsdp-resume") == [0, 0], launch.step("fsdp-resume")
    assert launch.rcs("fsdp-whole") == [0, 0], launch.step("fsdp-whole")
    resumed = _metrics(d / "metrics.jsonl")
    assert resumed == _metrics(whole / "metrics.jsonl")
    a, b = load_file(d / "policy" / "model.safetensors"), load_file(whole / "policy" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    x, y = resumed[0], _metrics(two / "metrics.jsonl")[0]
    assert x.keys() == y.keys()
    for k, v in y.items():  # numbers within rounding, the rest (the record's phase) equal: pytest 9.2's approx
        # refuses a relative tolerance on a string
        assert x[k] == (pytest.approx(v, rel=1e-4, abs=1e-5) if isinstance(v, int | float) else v), k
    assert set(_files(d)) == set(_files(one))  # (a resumed run has a second TensorBoard file)
    assert json.loads((d / "config.json").read_text())["run"]["parallel"] == "fsdp"


@pytest.mark.heavy
def test_a_rank_s_user_error_is_one_line_naming_the_rank(launch):
    assert launch.rcs("bad-timeout") == [2, 2], launch.step("bad-timeout")
    lines = [ln for r in launch.step("bad-timeout") for ln in r["stderr"].splitlines()
             if ln.startswith("lmprefs train-policy: error")]  # fmt: skip
    for rank in (0, 1):
        want = f"lmprefs train-policy: error (rank {rank} of 2): LMPREFS_DIST_TIMEOUT='soon'"
        assert sum(ln.startswith(want) for ln in lines) == 1, lines
    assert len(lines) == 2
    assert not (launch.dir / "bad").exists()


def test_one_process_has_no_group_and_the_helpers_change_nothing():
    from lmprefs.runtime import distributed as dist

    assert not dist.active() and dist.world() == 1 and dist.is_main()
    assert dist.rank_seed(7) == 7  # rank 0's seed is run.seed: one process samples as it always did
    stats = {"a": 1.0}
    assert dist.all_reduce_mean(stats) is stats
    x = torch.arange(10).view(5, 2)
    assert dist.shard(x) is x
    assert torch.equal(dist.interleave([dist.shard(x, r, 2) for r in range(2)]), x)
    assert dist.split_global(64, "ppo.batch_size", 4) == 64


def test_gloo_binds_the_loopback_when_every_rank_runs_on_this_machine(monkeypatch):
    """On one node gloo takes the loopback instead of looking the machine's hostname up (where it resolves to no
    address and no DNS server answers, each process group waited for the resolver); a user's GLOO_SOCKET_IFNAME and a
    job over several nodes are left alone."""
    from lmprefs.runtime import distributed as dist

    env = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    monkeypatch.setattr(os, "environ", env)  # this process's own environment stays as it is
    dist.gloo_on_loopback()
    assert env["GLOO_SOCKET_IFNAME"] == "lo"  # Linux's loopback
    env["GLOO_SOCKET_IFNAME"] = "eth7"
    dist.gloo_on_loopback()
    assert env["GLOO_SOCKET_IFNAME"] == "eth7"
    del env["GLOO_SOCKET_IFNAME"]
    env["LOCAL_WORLD_SIZE"] = "1"  # 2 nodes of one rank each
    dist.gloo_on_loopback()
    assert "GLOO_SOCKET_IFNAME" not in env


def test_optimizer_state_converts_between_positions_and_names():
    """A checkpoint's Adam state keyed by position (DDP, one process) or by parameter name (FSDP) loads either way,
    e.g. when a run continued after an andon stop changes run.parallel."""
    from lmprefs.models.loading import load_lm
    from lmprefs.models.policy import Policy
    from lmprefs.training.optim import TFAdam
    from lmprefs.training.policy_checkpoint import _optimizer_keys

    lm, tok = load_lm("tiny-gpt2")
    policy = Policy(lm, tok, 0.7)
    opt = TFAdam(policy.trainable_parameters(), lr=1e-3)
    q, r = torch.randint(0, 1000, (2, 4)), torch.randint(0, 1000, (2, 3))
    policy(q, r)[1].sum().backward()
    opt.step()
    saved = opt.state_dict()
    named = _optimizer_keys(policy, saved, by_name=True)
    assert named["param_groups"][0]["params"][0] == "lm.transformer.wte.weight"
    assert torch.equal(named["state"]["value_head.linear.weight"]["exp_avg"],
                       saved["state"][len(saved["state"]) - 2]["exp_avg"])  # fmt: skip
    back = _optimizer_keys(policy, named, by_name=False)
    assert back["param_groups"] == saved["param_groups"] and back["state"].keys() == saved["state"].keys()
    assert _optimizer_keys(policy, saved, by_name=False) is saved


@pytest.mark.heavy
def test_whole_state_of_fsdp_models_saves_as_the_usual_directories(worker_results, tmp_path):
    """The whole state gathered from FSDP shards, put in a meta-device twin (plain_copy, no second copy of the
    weights), saves through the usual writers: the reward model's and the policy's directories load back and score
    as the same models built by load_state_dict."""
    from lmprefs.models.artifacts import load_policy, load_reward_model, plain_copy, save_policy, save_reward_model
    from lmprefs.models.loading import load_lm
    from lmprefs.models.policy import Policy
    from lmprefs.models.reward_model import RewardModel

    fsdp = worker_results[1]["modes"]["fsdp"]
    lm, tok = load_lm("tiny-gpt2")
    q, r = torch.randint(0, 1000, (3, 5)), torch.randint(0, 1000, (3, 4))
    rm = RewardModel(copy.deepcopy(lm), tok)
    rm.load_state_dict(fsdp["rm"])
    save_reward_model(plain_copy(rm, fsdp["rm"]), tmp_path / "rm")
    with torch.no_grad():
        assert torch.allclose(load_reward_model(tmp_path / "rm")(q, r), rm(q, r), atol=1e-5)
    policy = Policy(copy.deepcopy(lm), tok, 0.7)
    policy.load_state_dict(fsdp["policy"])
    save_policy(plain_copy(policy, fsdp["policy"]), tmp_path / "policy")
    with torch.no_grad():
        for x, y in zip(load_policy(tmp_path / "policy")(q, r), policy(q, r), strict=True):
            assert torch.allclose(x, y, atol=1e-5)


def test_a_launched_process_ends_without_the_interpreter_s_finalization(monkeypatch, capsys):
    """gloo's worker threads outlive the process group, and one that frees its last collective while the interpreter
    finalizes aborts the rank after its work is done: the `lmprefs` entry point of a launched rank leaves through
    os._exit with the command's status and its output flushed. `main` itself returns (a library call, or the test
    worker running several commands in one rank), and so does the entry point without a launcher."""
    import lmprefs.cli.dispatch as dispatch
    from lmprefs.runtime import distributed

    exits = []

    class Exited(Exception):
        pass

    def fake_exit(rc):
        exits.append(rc)
        raise Exited

    monkeypatch.setattr(os, "_exit", fake_exit)
    monkeypatch.setattr(distributed, "init", lambda: False)
    monkeypatch.setitem(dispatch.HANDLERS, "train-policy", lambda rest: print("trained") or 3)
    monkeypatch.setattr(sys, "argv", ["lmprefs", "train-policy"])
    with pytest.raises(SystemExit) as e:
        dispatch.entry()
    assert e.value.code == 3 and exits == []
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert main(["train-policy"]) == 3 and exits == []
    with pytest.raises(Exited):
        dispatch.entry()
    assert exits == [3] and capsys.readouterr().out == "trained\n" * 3
