"""lmprefs train-dpo on the tiny preset: labels of a simulated labeler with a preference the tiny model can learn
(more commas), a run that raises the held-out preference accuracy and margin and saves a policy `lmprefs sample`
reads, a run killed after a checkpoint that resumes to bitwise the same weights, and LoRA with the listwise loss."""

import json
import math

import pytest
import torch
from crash import killed
from safetensors.torch import load_file

from lmprefs.cli.dispatch import main
from lmprefs.io.jsonl import read_jsonl
from lmprefs.labels.labelers import ScoreLabeler, label_items
from lmprefs.labels.store import LabelStore

# 96 pairs, a quarter held out: 9 steps of 8 labels (the tiny preset's dpo.batch_size), at its dpo.lr: its DPO
# defaults are the ones under test, where the paper's (lr 1e-6, batch 64) left this model where it was
PAIRS = ["--labels.type", "best_of_2", "--labels.num-train", "1000", "--labels.heldout-fraction", "0.25",
         "--run.save-interval", "3"]  # fmt: skip


def commas(texts: list[str]) -> list[float]:
    """The simulated labeler's score: commas in the response (ties are broken at random, as a labeler's are)."""
    return [float(t.count(",")) for t in texts]


def labeled_store(path, n: int, label_type: str):
    """A label store of n questions sampled from the tiny preset's initial policy, answered by `commas`."""
    assert main(["label", "tiny", "--db", str(path), "--n", str(n), "--labeler", "none",
                 "--labels.type", label_type]) == 0  # fmt: skip
    assert label_items(LabelStore(path), ScoreLabeler(commas, seed=0), "commas") == n
    return path


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("dpo")
    db = labeled_store(d / "pairs.sqlite", 96, "best_of_2")
    assert main(["train-dpo", "tiny", "--db", str(db), "--out", str(d / "run"), *PAIRS]) == 0
    return d


def dpo_rows(run_dir):
    return [{k: v for k, v in r.items() if k != "elapsed/time"} for r in read_jsonl(run_dir / "metrics.jsonl")]


def test_dpo_raises_heldout_preference_accuracy_and_margin(dpo_run, capsys):
    run = dpo_run / "run"
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if r["phase"] == "dpo"]
    steps = [r for r in rows if "dpo/loss" in r]
    assert [r["step"] for r in steps] == list(range(9))
    summary = rows[-1]
    # the policy starts as its reference: every implicit reward is 0, the loss log 2, and no chosen response is ahead
    assert summary["initial_heldout/loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert summary["initial_heldout/accuracy"] == 0 and summary["initial_heldout/margin"] == 0
    assert summary["heldout/accuracy"] > 0.6 and summary["heldout/margin"] > 0.03, summary  # chance: 0.5
    assert summary["heldout/loss"] < summary["initial_heldout/loss"]
    assert steps[-1]["dpo/margin"] > steps[0]["dpo/margin"]
    assert {"dpo/loss", "dpo/accuracy", "dpo/margin", "dpo/chosen_reward", "dpo/rejected_reward"} <= set(steps[0])
    assert list((run / "logs" / "dpo").glob("events.out.tfevents.*"))
    # saved as train-policy saves a policy: a Hugging Face directory `lmprefs sample` loads
    assert (run / "policy" / "model.safetensors").is_file()
    assert json.loads((run / "policy" / "lmprefs.json").read_text())["kind"] == "policy"
    capsys.readouterr()
    assert main(["sample", str(run), "--n", "2"]) == 0
    assert capsys.readouterr().out.count("=" * 80) == 2


def test_a_killed_dpo_run_resumes_to_bitwise_the_same_policy(dpo_run, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    args = ["train-dpo", "tiny", "--db", str(dpo_run / "pairs.sqlite"), "--run-dir", str(run), *PAIRS]
    killed(monkeypatch, args, "dpo:logged", 8)  # steps 0..7 logged; the last checkpoint holds 6 steps
    assert not (run / "policy").exists()
    assert main(args) == 2  # a second start would train over the checkpoint from scratch
    assert main(["train-dpo", "tiny", "--run-dir", str(run), "--db", str(tmp_path / "other.sqlite"), "--resume"]) == 2
    assert main(["train-dpo", "tiny", "--run-dir", str(run), "--resume"]) == 0
    a = load_file(run / "policy" / "model.safetensors")
    b = load_file(dpo_run / "run" / "policy" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert dpo_rows(run) == dpo_rows(dpo_run / "run")  # steps 6 and 7 logged again, each once
    # resumed once more, finished: nothing to train and not an error, as train-policy (docs/checkpoints.md)
    capsys.readouterr()
    assert main(["train-dpo", "tiny", "--run-dir", str(run), "--resume"]) == 0
    assert "finished already: nothing to train" in capsys.readouterr().out
    assert dpo_rows(run) == dpo_rows(dpo_run / "run")


def test_a_dpo_run_killed_at_its_first_writes_is_not_stuck_between_resume_and_start(dpo_run, tmp_path, monkeypatch):
    run = tmp_path / "run"
    args = ["train-dpo", "tiny", "--db", str(dpo_run / "pairs.sqlite"), "--run-dir", str(run), *PAIRS]
    killed(monkeypatch, args, "atomic-write:config.json")
    assert not (run / "config.json").exists()
    # config.json comes first, so the kill left no run.json either: --resume says to start without it, and the
    # command it was started with continues it (a run.json without the config.json --resume reads refused both)
    assert not (run / "run.json").exists()
    assert main(["train-dpo", "tiny", "--run-dir", str(run), "--resume"]) == 2
    assert main(args) == 0
    a = load_file(run / "policy" / "model.safetensors")
    b = load_file(dpo_run / "run" / "policy" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert dpo_rows(run) == dpo_rows(dpo_run / "run")


def test_lora_listwise_dpo_on_best_of_4_saves_an_adapter_and_starts_at_its_reference(tmp_path, capsys):
    db = labeled_store(tmp_path / "four.sqlite", 32, "best_of_4")
    run = tmp_path / "run"
    assert main(["train-dpo", "tiny", "--db", str(db), "--run-dir", str(run), "--dpo.loss", "listwise",
                 "--lora.rank", "4", "--dpo.lr", "1e-2", "--dpo.batch-size", "8",
                 "--labels.heldout-fraction", "0.25"]) == 0  # fmt: skip
    assert "held-out" in capsys.readouterr().out
    summary = read_jsonl(run / "metrics.jsonl")[-1]
    # the reference is the base with the adapter off: at the start the top-1 Plackett-Luce loss is log 4 exactly
    assert summary["initial_heldout/loss"] == pytest.approx(math.log(4), abs=1e-6)
    assert summary["heldout/loss"] < summary["initial_heldout/loss"], summary
    adapter = json.loads((run / "policy" / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and (run / "policy" / "model.safetensors").is_file()  # and the merged model
    assert main(["sample", str(run), "--n", "1"]) == 0


def test_lora_dpo_runs_the_frozen_blocks_once_with_the_full_forwards_log_probabilities(tmp_path):
    """With LoRA in the top block only, train-dpo computes the bottom block's outputs once for every label
    (`frozen_prefixes`) and runs the top block alone at each step and pass: the policy's and the reference's
    log-probabilities and the adapter's gradients equal those of the full forward."""
    from dataclasses import replace

    from lmprefs.config import preset
    from lmprefs.pipeline.dpo import dpo_labels, dpo_policy, dpo_task
    from lmprefs.training.dpo_train import all_logprobs, frozen_prefixes, response_logprobs

    db = labeled_store(tmp_path / "four.sqlite", 12, "best_of_4")
    cfg = preset("tiny")
    cfg = replace(cfg, labels=replace(cfg.labels, type="best_of_4"), lora=replace(cfg.lora, rank=4, layers=1),
                  run=replace(cfg.run, dtype="float32"))  # fmt: skip
    t = dpo_task(cfg)
    train = dpo_labels(t, LabelStore(db), str(db)).train
    policy, ref_lm = dpo_policy(t)
    pre = frozen_prefixes(policy, train, t.ctx, 4)
    assert ref_lm is None and pre is not None and pre.prefix.start == 1
    for reference in (False, True):
        with_prefix = all_logprobs(policy, train, t.ctx, 4, reference=reference, prefix=pre)
        torch.testing.assert_close(with_prefix, all_logprobs(policy, train, t.ctx, 4, reference=reference))
    grads = []
    idx = torch.tensor([2, 0, 3])
    for prefix in (pre.rows(idx), None):
        policy.zero_grad()
        mb = train[idx]
        response_logprobs(policy, mb.queries, mb.samples, t.ctx, prefix=prefix).sum().backward()
        grads.append([p.grad.clone() for p in policy.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)
    full = replace(cfg, lora=replace(cfg.lora, rank=0))
    assert frozen_prefixes(dpo_policy(dpo_task(full))[0], train, t.ctx, 4) is None  # every block trains


def test_the_default_microbatch_bounds_a_cpu_steps_logits_by_the_free_memory(monkeypatch):
    """dpo.microbatch None: on a CPU the most labels (a power of two) whose fp32 logits fit 512 MiB and an eighth
    of the free memory; the whole batch on a GPU; a value given is kept (0: the whole batch)."""
    from dataclasses import replace

    from lmprefs.config import preset
    from lmprefs.training import dpo_train

    d = preset("quickstart").dpo
    assert d.microbatch is None and d.batch_size == 64
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    shape = (4, 24, 49152)  # the quickstart's best-of-4 labels of 24 tokens, SmolLM2's vocabulary: 18.9 MB a label
    free = {"bytes": 64 << 30}
    monkeypatch.setattr(dpo_train, "available_memory", lambda: free["bytes"])
    assert dpo_train.dpo_microbatch(d, *shape, cpu) == 16  # 512 MiB hold 28 labels' logits
    free["bytes"] = 1 << 30  # 128 MiB for logits: 7 labels
    assert dpo_train.dpo_microbatch(d, *shape, cpu) == 4
    free["bytes"] = 1 << 20  # next to nothing: one label a forward, never none
    assert dpo_train.dpo_microbatch(d, *shape, cpu) == 1
    free["bytes"] = None  # not Linux: the fixed bound alone
    assert dpo_train.dpo_microbatch(d, *shape, cpu) == 16
    assert dpo_train.dpo_microbatch(d, *shape, gpu) == 64
    assert dpo_train.dpo_microbatch(d, 2, 8, 50257, cpu) == 64  # small logits: the whole batch
    assert dpo_train.dpo_microbatch(replace(d, microbatch=0), *shape, cpu) == 64
    assert dpo_train.dpo_microbatch(replace(d, microbatch=8), *shape, gpu) == 8


def test_a_microbatched_dpo_step_equals_the_whole_batch_step():
    """The same labels in one forward or in forwards of 3 + 3 + 2 labels: the same gradients and stats within float
    rounding (the sum's order differs), weighted labels included."""
    from dataclasses import replace

    from lmprefs.config import preset
    from lmprefs.pipeline.dpo import dpo_policy, dpo_task
    from lmprefs.training.comparisons import Comparisons
    from lmprefs.training.dpo_train import _step

    cfg = preset("tiny")
    cfg = replace(cfg, labels=replace(cfg.labels, type="best_of_4"), run=replace(cfg.run, dtype="float32"))
    t = dpo_task(cfg)
    policy, _ = dpo_policy(t)
    g = torch.Generator().manual_seed(0)
    n, q, r = 8, cfg.task.query_length, cfg.task.response_length
    data = Comparisons(torch.randint(0, 5000, (n, q), generator=g), torch.randint(0, 5000, (n, 4, r), generator=g),
                       torch.randint(0, 4, (n,), generator=g), weights=torch.rand(n, generator=g) + 0.5)  # fmt: skip
    ref = torch.randn(n, 4, generator=g) - 40  # a reference other than the policy: losses away from log 2
    idx = torch.tensor([5, 2, 7, 0, 1, 6, 3, 4])
    out = []
    for micro in (8, 3):
        policy.zero_grad(set_to_none=True)
        stats = _step(policy, data, ref, idx, cfg, t.ctx, None, micro=micro)
        out.append((stats, [p.grad.clone() for p in policy.parameters() if p.grad is not None]))
    (whole, gw), (parts, gp) = out
    assert len(gw) == len(gp) > 0
    for a, b in zip(gw, gp, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert whole.keys() == parts.keys()
    for k in whole:
        assert parts[k] == pytest.approx(whole[k], rel=1e-5, abs=1e-6), k
