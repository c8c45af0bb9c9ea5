"""A separate value model (ppo.value_model=separate; the later summarization and writing-prompts work): its own
trunk (or LoRA adapter) and head, its own optimizer (ppo.vf_lr), checkpointed and resumed exactly."""

import copy
import dataclasses

import crash
import pytest
import torch
from safetensors.torch import load_file

from lmprefs.cli.dispatch import main
from lmprefs.config import preset
from lmprefs.data.queries import QueryStream
from lmprefs.io.jsonl import read_jsonl
from lmprefs.pipeline.policy import policy_for
from lmprefs.pipeline.task import setup_task
from lmprefs.training.policy_run import build_run
from lmprefs.training.ppo import ppo_update
from lmprefs.training.rollout import make_rollout

R = dataclasses.replace


def low_ids_score(queries, responses, prefix=None):
    return (responses.clamp(min=0) < 25000).float().mean(1) * 2 - 1


@pytest.fixture(scope="module")
def tiny_task():
    return setup_task(preset("tiny"), n_heldout=16)


def one_update(t, value_model: str, vf_coef: float, vf_lr: float | None = None):
    """(policy, value) parameters after one PPO update of a fresh policy on the same rollout."""
    cfg = preset("tiny")
    cfg = R(cfg, ppo=R(cfg.ppo, value_model=value_model, vf_coef=vf_coef, vf_lr=vf_lr))
    policy = policy_for(R(t, cfg=cfg, model=copy.deepcopy(t.model)))
    run = build_run(cfg, policy, QueryStream(t.train_queries, 1), t.device)
    torch.manual_seed(0)
    rollout, _, _ = make_rollout(run, low_ids_score, run.stream.next(16), cfg, t.ctx)
    ppo_update(lambda mb: policy(mb.queries, mb.responses), run.optimizers, rollout, cfg.ppo, run.gen_ppo)
    value = {id(p) for p in policy.value_parameters()}
    return ([p.detach().clone() for p in policy.trainable_parameters() if id(p) not in value],
            [p.detach().clone() for p in policy.value_parameters()])  # fmt: skip


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_separate_value_model_trains_apart_from_the_policy(tiny_task):
    pol, val = one_update(tiny_task, "separate", 0.1)
    assert len(val) > 2 and len(pol) > 2  # a trunk of its own, not just a head
    # the value loss's weight and the value model's learning rate move only the value model
    pol2, val2 = one_update(tiny_task, "separate", 1.0)
    assert same(pol, pol2) and not same(val, val2)
    pol3, val3 = one_update(tiny_task, "separate", 0.1, vf_lr=1e-2)
    assert same(pol, pol3) and not same(val, val3)
    # on a shared trunk the value loss moves the policy too
    shared, _ = one_update(tiny_task, "shared", 0.1)
    shared2, _ = one_update(tiny_task, "shared", 1.0)
    assert not same(shared, shared2)


def test_vf_lr_needs_a_separate_value_model():
    from lmprefs.config.overrides import ConfigError, apply_overrides

    with pytest.raises((ConfigError, ValueError), match="ppo.vf_lr=0.001 sets the optimizer of a separate value"):
        apply_overrides(preset("tiny"), [("ppo.vf_lr", "1e-3")])


ARGS = ["train-policy", "tiny", "--reward", "vader", "--run.log-interval", "100", "--ppo.total-episodes", "64",
        "--ppo.value-model", "separate", "--ppo.vf-lr", "3e-4"]  # fmt: skip


def tensors(run_dir):
    d = run_dir / "policy"
    value = load_file(d / "value_model" / "model.safetensors")
    out = load_file(d / "model.safetensors") | {f"value_model.{k}": v for k, v in value.items()}
    return out | {f"value_head.{k}": v for k, v in load_file(d / "value_head.safetensors").items()}


def metrics(run_dir):
    rows = read_jsonl(run_dir / "metrics.jsonl")
    return [{k: v for k, v in r.items() if not k.startswith("elapsed/")} for r in rows]


def test_a_separate_value_model_checkpoints_and_resumes_exactly(tmp_path, monkeypatch, tiny_task):
    full, killed = tmp_path / "full", tmp_path / "killed"
    assert main(ARGS + ["--run-dir", str(full)]) == 0
    rows = read_jsonl(full / "metrics.jsonl")
    assert rows[0]["ppo/vf_lr"] == 3e-4 and rows[0]["ppo/lr"] == preset("tiny").ppo.lr
    state = torch.load(full / "checkpoint" / "state.pt", weights_only=True)
    assert state["value_optimizer"]["state"]  # the value model's Adam moments are in the checkpoint

    crash.killed(monkeypatch, ARGS + ["--run-dir", str(killed)], "train:saved", 2)
    assert len(read_jsonl(killed / "metrics.jsonl")) == 2
    assert main(["train-policy", "tiny", "--resume", "--run-dir", str(killed)]) == 0
    assert metrics(killed) == metrics(full)
    a, b = tensors(full), tensors(killed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    key = "transformer.h.0.attn.c_attn.weight"
    init = tiny_task.model.state_dict()[key]  # the initial model (one_update trains deep copies of it)
    assert not torch.equal(a[f"value_model.{key}"], init)  # the value trunk trained, apart from the policy's
    assert not torch.equal(a[f"value_model.{key}"], a[key])
