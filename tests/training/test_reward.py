import copy
import dataclasses

import torch
from crash import killed

from lmprefs.cli.dispatch import main
from lmprefs.config import preset
from lmprefs.data.tasks import PAD, TaskContext
from lmprefs.labels.types import get as get_label_type
from lmprefs.models.reward_model import RewardModel
from lmprefs.pipeline.task import setup_task
from lmprefs.training.question_prefixes import QuestionPrefixes, label_prefixes
from lmprefs.training.reward import (
    Comparisons,
    evaluate,
    heldout_mask,
    normalize,
    rm_rewards,
    train_epoch,
)

R = dataclasses.replace


def test_normalization_reaches_mean_0_std_1_on_the_sampled_set(tiny_lm):
    cfg = preset("tiny")
    t = setup_task(cfg, n_heldout=8)
    rm = RewardModel(copy.deepcopy(t.model), t.tok)
    with torch.no_grad():
        rm.gain.fill_(3.0)
        rm.bias.fill_(-2.0)  # start from a non-trivial gain/bias: set_norm must account for them
    out = normalize(rm, t.model, t.tok, t.train_queries, cfg, t.ctx, torch.Generator().manual_seed(0))
    r = rm_rewards(rm, out["queries"], out["responses"], t.ctx).double()
    assert len(r) == cfg.train_reward.normalize_samples
    assert abs(r.mean().item()) < 1e-3 and abs(r.std(unbiased=False).item() - 1) < 1e-3


def test_normalization_scores_from_the_sampling_pass_prefix(tiny_lm):
    """A reward model on the sampled model's own base (LoRA in the top block) scores the normalization samples from
    the prefix the sampling pass kept: the rewards it normalizes are those of a plain forward within rounding."""
    from lmprefs.config import LoraConfig
    from lmprefs.pipeline.reward_model import reward_frame
    from lmprefs.training.reward import normalization_samples

    cfg = preset("tiny")
    cfg = R(cfg, lora=LoraConfig(rank=4, alpha=8.0, layers=1), train_reward=R(cfg.train_reward, normalize_samples=12))
    t = setup_task(cfg, n_heldout=8)
    rm = reward_frame(t)
    gen = torch.Generator().manual_seed(0)
    q, r, prefixes = normalization_samples(t.model, t.tok, t.train_queries, cfg, t.ctx, gen, prefix_depth=1)
    assert prefixes is not None and prefixes.prefix.start == 1 and len(prefixes.prefix) == len(q) == 12
    with torch.no_grad():
        rm.head.linear.weight.normal_()  # an untrained head reads little: make the rewards spread
    plain = rm_rewards(rm, q, r, t.ctx)
    torch.testing.assert_close(rm_rewards(rm, q, r, t.ctx, prefixes=prefixes), plain, rtol=1e-4, atol=1e-5)
    out = normalize(rm, t.model, t.tok, t.train_queries, cfg, t.ctx, torch.Generator().manual_seed(0))
    assert out["responses"].equal(r)  # the same draws as without a prefix kept
    after = rm_rewards(rm, q, r, t.ctx).double()  # plain forwards, normalized by the prefix-scored moments
    assert abs(after.mean().item()) < 1e-4 and abs(after.std(unbiased=False).item() - 1) < 1e-4


def _scripted(n, g, marker=0):
    """Best-of-4 questions where the preferred sample is the one that ends in the marker token ('!')."""
    q = torch.randint(300, 20000, (n, 6), generator=g)
    s = torch.randint(300, 20000, (n, 4, 5), generator=g)
    best = torch.randint(0, 4, (n,), generator=g)
    s[torch.arange(n), best, -1] = marker
    s[:, :, 3][torch.rand(n, 4, generator=g) < 0.3] = 500  # some noise tokens, some padding after truncation
    s[:, :, 4][(torch.rand(n, 4, generator=g) < 0.2) & (s[:, :, 4] != marker)] = PAD
    return Comparisons(q, s, best)


def test_tiny_reward_model_learns_a_scripted_preference(tiny_lm):
    model, tok = tiny_lm
    g = torch.Generator().manual_seed(0)
    train, held = _scripted(320, g), _scripted(64, g)
    cfg = preset("tiny")
    cfg = R(cfg, train_reward=R(cfg.train_reward, batch_size=8, lr=2e-3))
    rm = RewardModel(copy.deepcopy(model), tok, seed=1)  # the head's init, whatever tests ran before
    lt = get_label_type("best_of_4")
    before = evaluate(rm, held, lt, TaskContext([], [], torch.device("cpu"), torch.float32))
    rm.train()
    train_epoch(rm, train, lt, cfg, TaskContext([], [], torch.device("cpu"), torch.float32))
    after = evaluate(rm.eval(), held, lt, TaskContext([], [], torch.device("cpu"), torch.float32))
    # a random head may already lean towards the marker token (0.3-0.7 over seeds); training makes it decisive
    assert after["heldout/accuracy"] > 0.9 and after["heldout/accuracy"] > before["heldout/accuracy"] + 0.2, (before,
                                                                                                            after)
    assert after["heldout/loss"] < before["heldout/loss"]


def test_a_reward_model_learns_from_rankings_with_the_plackett_luce_loss(tiny_lm):
    """ranking_4 labels: the marked sample first, the others in a random order; the minibatches carry the ranking,
    and training lowers the held-out Plackett-Luce loss."""
    model, tok = tiny_lm
    g = torch.Generator().manual_seed(1)

    def ranked(n):
        data = _scripted(n, g)
        rest = torch.argsort(torch.rand(n, 4, generator=g), dim=1)
        rest = rest[rest != data.best.unsqueeze(1).expand(n, 4)].view(n, 3)  # the other three, shuffled
        data.ranking = torch.cat([data.best.unsqueeze(1), rest], dim=1)
        return data

    train, held = ranked(160), ranked(48)
    cfg = preset("tiny")
    cfg = R(cfg, train_reward=R(cfg.train_reward, batch_size=8, lr=2e-3))
    rm, lt = RewardModel(copy.deepcopy(model), tok), get_label_type("ranking_4")
    ctx = TaskContext([], [], torch.device("cpu"), torch.float32)
    assert set(train[:2].labels()) == {"best", "ranking"}
    before = evaluate(rm, held, lt, ctx)
    rm.train()
    train_epoch(rm, train, lt, cfg, ctx)
    after = evaluate(rm.eval(), held, lt, ctx)
    assert after["heldout/loss"] < before["heldout/loss"] and after["heldout/accuracy"] > before["heldout/accuracy"]


def test_confidence_weights_the_loss_by_confidence_over_3(tiny_lm, tmp_path):
    from lmprefs.labels.store import LabelStore
    from lmprefs.pipeline.reward_model import load_examples

    _, tok = tiny_lm
    with LabelStore(tmp_path / "c.sqlite") as store:
        for k, sure in enumerate((1, 2, 3, None)):
            item = store.add_item(f"Query {k}.", [f" answer {k}.{j}" for j in range(4)], source="t")
            store.add_label(item, "ann", best=k, confidence=sure)
        cfg = preset("tiny")
        plain = load_examples(cfg, store, tok)
        data = load_examples(R(cfg, labels=R(cfg.labels, weight_by_confidence=True)), store, tok)
    assert plain.weights is None and torch.allclose(data.weights, torch.tensor([1 / 3, 2 / 3, 1.0, 1.0]))
    rewards = torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 2.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    each = [torch.logsumexp(r, 0) - r[b] for r, b in zip(rewards, data.best.tolist(), strict=True)]  # by hand
    by_hand = sum(x * w for x, w in zip(each, [1 / 3, 2 / 3, 1, 1], strict=True)) / 4
    lt = get_label_type("best_of_4")
    out = lt.loss(rewards, data.labels())
    assert torch.allclose(out["loss"], by_hand) and torch.allclose(out["error"], sum(each) / 4)
    assert not torch.allclose(out["loss"], lt.loss(rewards, plain.labels())["loss"])


def test_cached_frozen_blocks_and_microbatches_train_the_same_reward_model(tiny_lm):
    from lmprefs.config import LoraConfig
    from lmprefs.models.lora import add_adapter

    model, tok = tiny_lm
    train = _scripted(40, torch.Generator().manual_seed(0))
    cfg = preset("tiny")
    lt, cpu = get_label_type("best_of_4"), torch.device("cpu")

    def trained(microbatch: int, cached: bool) -> list[torch.Tensor]:
        lm = copy.deepcopy(model)
        add_adapter(lm, LoraConfig(rank=2, layers=1), "reward")
        rm = RewardModel(lm, tok, adapter="reward", seed=0)
        own = label_prefixes(rm.lm, train, TaskContext([], [], cpu, torch.float32), 16) if cached else None
        assert (own is not None) == cached
        cache = QuestionPrefixes.own(own, train) if own is not None else None
        tr = R(cfg.train_reward, batch_size=8, lr=2e-3, epochs=2, microbatch=microbatch)
        train_epoch(rm, train, lt, R(cfg, train_reward=tr), TaskContext([], [], cpu, torch.float32), cache=cache)
        return [p.detach().clone() for p in rm.trainable_parameters()]

    plain = trained(0, False)
    init = RewardModel(copy.deepcopy(model), tok, seed=0)
    assert not torch.equal(plain[-2], init.head.linear.weight)  # it trained (and the head init is seeded)
    # the frozen blocks run once over batches of 16 questions instead of inside each batch of 8: bitwise the same
    # where the CPU's GEMM does not depend on the row count (AVX-512 here), 1e-8 to 1e-6 apart after two epochs
    # where it does (MKL's AVX2 kernels)
    assert all(torch.allclose(a, b, rtol=0, atol=1e-5) for a, b in zip(plain, trained(0, True), strict=True))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(plain, trained(3, True), strict=True))  # 3+3+2


def test_heldout_split_is_stable_as_the_store_grows():
    items = torch.arange(1, 2001)
    held = heldout_mask(items, 1, 0.1)
    assert 150 < int(held.sum()) < 250
    assert torch.equal(heldout_mask(items[:500], 1, 0.1), held[:500])  # earlier items keep their side
    assert not torch.equal(heldout_mask(items, 2, 0.1), held)  # the seed picks another split


def test_label_train_reward_and_score_commands(tmp_path, capsys):
    db = tmp_path / "l.sqlite"
    assert main(["label", "tiny", "--db", str(db), "--n", "40", "--labeler", "vader"]) == 0
    assert "40 labels by vader" in capsys.readouterr().out
    assert main(["train-reward", "tiny", "--db", str(db), "--run-dir", str(tmp_path / "r")]) == 0
    assert "held-out" in capsys.readouterr().out
    (tmp_path / "texts.txt").write_text("She smiled.\nA query\tHe wept.\n")
    assert main(["score", "--reward-model", str(tmp_path / "r" / "reward_model"), str(tmp_path / "texts.txt")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(float(x.split("\t")[0]) == float(x.split("\t")[0]) for x in lines)
    # a text longer than the trained response (8 tokens) is scored whole, with a warning;
    # --truncate cuts it to the trained lengths, as a text of its first 8 tokens scores
    rm_dir = str(tmp_path / "r" / "reward_model")
    long = "She smiled and laughed and danced all night long in the garden with her friends."
    (tmp_path / "long.txt").write_text(long + "\n")
    assert main(["score", "--reward-model", rm_dir, str(tmp_path / "long.txt")]) == 0
    out, err = capsys.readouterr()
    whole = float(out.split("\t")[0])
    assert "1 of 1 texts are longer" in err and "scored whole" in err and len(err.splitlines()) == 1
    assert main(["score", "--reward-model", rm_dir, "--truncate", str(tmp_path / "long.txt")]) == 0
    out, err = capsys.readouterr()
    cut = float(out.split("\t")[0])
    from lmprefs.assets.tokenizers import gpt2_tokenizer

    tok = gpt2_tokenizer()
    (tmp_path / "first8.txt").write_text(tok.decode(tok(long).input_ids[:8]) + "\n")
    assert main(["score", "--reward-model", rm_dir, str(tmp_path / "first8.txt")]) == 0
    assert abs(float(capsys.readouterr().out.split("\t")[0]) - cut) < 1e-4 and abs(whole - cut) > 1e-4
    assert main(["score", "--reward-model", str(tmp_path)]) == 2
    assert "not a reward-model directory" in capsys.readouterr().err
    assert main(["train-reward", "tiny", "--db", str(tmp_path / "none.sqlite")]) == 2


def test_a_killed_train_reward_started_again_in_its_run_dir_logs_each_step_once(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lmprefs.io.jsonl import read_jsonl

    db = tmp_path / "l.sqlite"
    assert main(["label", "tiny", "--db", str(db), "--n", "40", "--labeler", "vader"]) == 0
    args = ["train-reward", "tiny", "--db", str(db), "--run.log-interval", "1"]
    full, d = tmp_path / "full", tmp_path / "killed"
    assert main(args + ["--run-dir", str(full)]) == 0

    killed(monkeypatch, args + ["--run-dir", str(d)], "reward:logged", 3)  # while it trains: no reward model yet
    assert len(read_jsonl(d / "metrics.jsonl")) == 3 and not (d / "reward_model").exists()
    assert main(args + ["--run-dir", str(d)]) == 0  # the same command again trains it from its start

    def rows(run):
        return [{k: v for k, v in r.items() if k != "elapsed/time"} for r in read_jsonl(run / "metrics.jsonl")]

    assert rows(d) == rows(full)  # each step once

    def events(run):
        ea = EventAccumulator(str(run / "logs" / "reward"))
        ea.Reload()
        return {tag: [(e.step, e.value) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]
                if tag != "elapsed/time"} | {tag: [e.step for e in ea.Tensors(tag)] for tag in ea.Tags()["tensors"]}

    assert events(d) == events(full)


def test_a_store_of_another_label_type_is_refused_before_anything_is_written(tmp_path, capsys):
    import json

    pairs, db = tmp_path / "pairs.jsonl", str(tmp_path / "l.sqlite")
    pairs.write_text("".join(json.dumps({"prompt": f"q{i}", "chosen": "a good one", "rejected": "a bad one"}) + "\n"
                             for i in range(8)))  # fmt: skip
    assert main(["import-labels", str(pairs), "--db", db]) == 0  # TRL pairs: best_of_2, the tiny preset best_of_4
    for cmd in ("train-reward", "train-policy"):
        run_dir = tmp_path / cmd
        capsys.readouterr()
        assert main([cmd, "tiny", "--db", db, "--run-dir", str(run_dir)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "holds best_of_2 labels, not labels.type=best_of_4" in err, err
        assert "--labels.type best_of_2" in err and not run_dir.exists()


def test_train_reward_refuses_a_run_dir_another_process_holds(tmp_path, capsys):
    """One process per run directory, as for the other commands: a second train-reward into it would log into the
    same metrics.jsonl and publish over the first one's reward model."""
    from lmprefs.io.locks import run_lock

    db, run = tmp_path / "l.sqlite", tmp_path / "run"
    assert main(["label", "tiny", "--db", str(db), "--n", "16", "--labeler", "vader"]) == 0
    capsys.readouterr()
    with run_lock(run):  # another holder: flock conflicts between two opens, in one process too
        assert main(["train-reward", "tiny", "--db", str(db), "--run-dir", str(run)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{run} is in use by pid " in line and not (run / "metrics.jsonl").exists()
    assert main(["train-reward", "tiny", "--db", str(db), "--run-dir", str(run)]) == 0  # free again
