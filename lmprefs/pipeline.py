"""The stages the commands share: set up a task (device, model, queries), collect simulated judgments into the
label store, and train a reward model from the store. `lmprefs label`, `train-reward`, `train-policy` and
`quickstart` are thin wrappers around these."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lmprefs import distributed as dist
from lmprefs.config import Config
from lmprefs.errors import UserError

HELDOUT_QUERIES = 512  # queries set aside (a fixed permutation) for evaluation; never trained on
PREFIX_CACHE_BYTES = 4 << 30  # reward-model training keeps the frozen blocks' outputs of all labels up to this size


@dataclass
class Task:
    cfg: Config
    device: torch.device
    dtype: torch.dtype
    model: object  # the initial policy LM (fp32, eval, dropout off)
    tok: object
    train_queries: torch.Tensor  # [N, Q] PAD right
    heldout_queries: torch.Tensor
    prefix: list[int]
    suffix: list[int]


def setup_torch(run) -> tuple[torch.device, torch.dtype]:
    """Device, autocast dtype and threads from RunConfig."""
    from lmprefs.distributed import device_for
    from lmprefs.models.lm import pick_device, pick_dtype

    if run.threads:
        torch.set_num_threads(run.threads)
    device = device_for(pick_device(run.device))  # cuda:LOCAL_RANK under a launcher
    return device, pick_dtype(run.dtype, device)


def setup_task(cfg: Config, n_heldout: int = HELDOUT_QUERIES) -> Task:
    from lmprefs.models.lm import load_lm, max_positions
    from lmprefs.queries import task_queries

    device, dtype = setup_torch(cfg.run)
    torch.manual_seed(cfg.run.seed)
    model, tok = load_lm(cfg.task.initial_model, device)
    train, heldout, prefix, suffix = task_queries(cfg.task, tok, max_positions(model), n_heldout)
    return Task(cfg, device, dtype, model, tok, train, heldout, prefix, suffix)


def open_store(path: str | Path):
    from lmprefs.labels.store import LabelStore, check_store_path

    return LabelStore(check_store_path(path, must_exist=False))


def label_source(source: str):
    """A label store from a .sqlite path, or a temporary store holding an imported label file."""
    import tempfile

    from lmprefs.labels.formats import LabelFileError, import_file

    p = Path(source)
    if p.suffix in (".sqlite", ".db"):
        from lmprefs.labels.store import LabelStore, check_store_path

        return LabelStore(check_store_path(p, must_exist=True))
    if not p.is_file():
        raise UserError(f"label source {p} does not exist")
    store = open_store(Path(tempfile.mkdtemp(prefix="lmprefs-labels-")) / "labels.sqlite")
    try:
        import_file(store, p)
    except LabelFileError as e:
        raise UserError(str(e)) from None
    return store


def collect_labels(t: Task, store, n: int, *, labeler: str | None = None, source: str = "lmprefs label",
                   batch: str | None = None, seed: int | None = None, queries: torch.Tensor | None = None,
                   model=None, adapter: str | None = None) -> dict:  # fmt: skip
    """Sample `n` questions of N continuations from the initial policy (or `model` with `adapter`: the current
    policy, in online mode), put them in the store, and have the simulated labeler judge them ('none': queue them
    for people). Returns counts and timings.
    Under several ranks each samples a strided share of the questions with its own seed, and rank 0 alone writes
    them all (in the order one process would) and labels them; `store` may be None on the other ranks."""
    from lmprefs.labels.labelers import label_items, make_labeler, score_fn
    from lmprefs.labels.types import get as get_label_type
    from lmprefs.runlog import progress
    from lmprefs.tasks import decode
    from lmprefs.training.reward import sample_comparisons, tokenizer_id

    cfg = t.cfg
    lt = get_label_type(cfg.labels.type)
    S = getattr(lt, "num_samples", None)
    if S is None:
        raise UserError(f"labels.type={cfg.labels.type!r}: simulated labeling samples best_of_N questions only")
    seed = cfg.run.seed if seed is None else seed
    name = labeler or cfg.labels.labeler
    if name != "none":
        score_fn(name)  # its assets are there before anything is sampled or stored
    pool = t.train_queries if queries is None else queries
    # each query once per round, in a fresh order each round: more questions than queries (300 news articles) ask
    # about some queries again, with new samples (the original's labels also share queries)
    g = torch.Generator().manual_seed(seed + 17)
    pick = torch.cat([torch.randperm(len(pool), generator=g) for _ in range(-(-n // len(pool)))])[:n]
    q = pool[pick]
    gen = torch.Generator(device=t.device).manual_seed(dist.rank_seed(seed))
    t0 = time.time()
    from lmprefs.models.lora import using
    from lmprefs.sampling import sampler_options

    bar = progress(n, "sampling comparisons")
    model = t.model if model is None else model
    with using(model, adapter):
        samples = sample_comparisons(model, t.tok, dist.shard(q), cfg.task, t.prefix, t.suffix, S,
                                     max(1, cfg.train_reward.rollout_batch_size // dist.world()), gen, t.device,
                                     t.dtype, lambda k: bar.update(k * dist.world()),
                                     sampler_options(cfg.run))  # fmt: skip
    bar.close()
    if dist.world() > 1:
        samples = dist.interleave(dist.all_gather_objects(samples))  # [n, S, T], question i from rank i % W
    t_sample = time.time() - t0
    if not dist.is_main():  # rank 0 writes and labels; the others wait for the store to be complete
        dist.barrier()
        return {"items": n, "labels_added": 0, "labeler": labeler or cfg.labels.labeler, "sample_seconds": t_sample,
                "seconds": time.time() - t0}  # fmt: skip
    tok_name = tokenizer_id(t.tok)
    q_text = decode(t.tok, q)
    item_ids = []
    with store.transaction():
        for i in range(n):
            ids = [[x for x in s if x >= 0] for s in samples[i].tolist()]
            item_ids.append(store.add_item(
                q_text[i], decode(t.tok, samples[i]), source=source, label_type=lt.name,
                query_tokens=[x for x in q[i].tolist() if x >= 0], sample_tokens=ids, tokenizer=tok_name,
                batch=batch, key=f"{seed}:{i}",
            ))  # fmt: skip
    added = 0
    if name != "none":
        sim = make_labeler(name, cfg.labels.labeler_temperature, cfg.labels.labeler_random_rate, seed)
        items = [store.get_item(i) for i in item_ids]
        added = label_items(store, sim, name, items)
    dist.barrier()
    return {"items": n, "labels_added": added, "labeler": name, "sample_seconds": t_sample,
            "seconds": time.time() - t0}  # fmt: skip


def load_examples(cfg: Config, store, tok, report: dict | None = None, exclude_items: set[int] = frozenset()):
    """Every label of labels.type in the store (but those on `exclude_items`), as tensors in `tok`'s ids (the caller
    splits off held-out labels and keeps labels.num_train); per-response scores as they are, or compared within each
    prompt into best_of_2 questions (labels.scores_as=comparisons); without the labels of labelers under
    labels.min_gold_accuracy. `report`, if given, receives {labeler: {"labels", "gold", "dropped", "weight"}}
    (quality.select_labelers); with labels.weight_by_gold the comparisons carry those weights, scaled to mean 1."""
    from lmprefs.labels.quality import describe_labelers as describe
    from lmprefs.labels.quality import select_labelers
    from lmprefs.training.reward import examples_to_comparisons, tokenizer_id

    examples = store.labeled_examples(cfg.labels.type, tokenizer=tokenizer_id(tok))
    examples = [e for e in examples if e.item_id not in exclude_items]
    if not examples:
        how = "import-labels --format scores" if cfg.labels.type == "scalar_rating" else "lmprefs label"
        raise UserError(f"the label store holds no {cfg.labels.type} labels; run `{how}` or import a file with "
                        "--labels")  # fmt: skip
    examples, by_labeler = select_labelers(examples, store, cfg.labels.min_gold_accuracy)
    if report is not None:
        report.update(by_labeler)
    if not examples:
        raise UserError(f"labels.min_gold_accuracy={cfg.labels.min_gold_accuracy} drops every labeler "
                        f"({describe(by_labeler)})")  # fmt: skip
    data = examples_to_comparisons(examples, tok, cfg.task)
    if cfg.labels.scores_as == "comparisons":
        from lmprefs.training.reward import pairs_from_scores

        data = pairs_from_scores(data, cfg.labels.min_score_gap)
        if not len(data):
            raise UserError(f"labels.scores_as=comparisons: no two responses to one prompt have scores more than "
                            f"labels.min_score_gap={cfg.labels.min_score_gap} apart ({len(examples)} scores)")
    if cfg.labels.weight_by_gold:
        w = torch.tensor([by_labeler[e.labeler]["weight"] for e in examples], dtype=torch.float32)  # [N]
        if w.sum() <= 0:
            raise UserError(f"labels.weight_by_gold: every labeler is at chance on gold questions "
                            f"({describe(by_labeler)})")  # fmt: skip
        data.weights = w / w.mean()  # mean 1: the loss keeps its scale, and the learning rate its meaning
    return data


def train_reward_model(t: Task, store, out_dir: Path, log=None,
                       exclude_items: set[int] = frozenset()) -> tuple[object, dict]:  # fmt: skip
    """Normalize, train (train_reward.epochs passes), normalize, evaluate on the held-out labels, save to out_dir.
    -> (rm, summary). Held out (`heldout_labels`): by labels.heldout_by, the items of an imported split other than
    `train`, and the items (per-response scores: the prompts) whose hash of (run.seed, item id or prompt) falls under
    labels.heldout_fraction; summary["heldout/split"] names which.
    `exclude_items`: labels not to use (an online run redoing updates after its checkpoint: later batches')."""
    from lmprefs.models.lm import frozen_depth, save_reward_model
    from lmprefs.runlog import progress
    from lmprefs.training.reward import evaluate, normalize, prefix_bytes, reward_prefixes, train_epoch

    cfg = t.cfg
    by_labeler: dict = {}
    data = load_examples(cfg, store, t.tok, by_labeler, exclude_items)
    is_held, measured = heldout_labels(cfg, store, data)
    held, train = data[is_held], data[~is_held]
    if cfg.labels.subset_seed is not None:  # a random subset: seeds of one experiment train on different labels
        train = train[torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.labels.subset_seed))]
    train = train[: cfg.labels.num_train]
    if len(train) == 0:
        raise UserError(f"no labels left for training: all {len(data)} are held out ({measured}; labels.heldout_by="
                        f"{cfg.labels.heldout_by}, heldout_fraction {cfg.labels.heldout_fraction})")  # fmt: skip
    lt = training_label_type(cfg)
    t0 = time.time()
    rm = reward_frame(t)
    if cfg.lora.rank > 0:
        from lmprefs.models.lora import reset_adapter

        reset_adapter(t.model, "reward", seed=cfg.run.seed)  # a retrain starts from the initial model, as the paper
    else:
        rm.lm.requires_grad_(True)
    gen = torch.Generator(device=t.device).manual_seed(dist.rank_seed(cfg.run.seed) + 2)
    summary = {"labels_train": len(train), "labels_heldout": len(held), "heldout/split": measured,
               "labelers": by_labeler}  # fmt: skip
    gap = cfg.labels.min_score_gap
    scales = lt.target_scales(train.labels())  # scalar ratings: the scores' mean and std; None for choices
    if cfg.train_reward.normalize_before:
        # start at the scale of the labels (train_reward.py:target_mean_std), else at mean 0, std 1
        target = (0.0, 1.0) if scales is None else (float(scales[0]), max(float(scales[1]), 1e-6))
        nb = normalize(rm, t.model, t.tok, t.train_queries, cfg, t.prefix, t.suffix, gen, t.device, t.dtype, target)
        summary["norm_before"] = {"mean": nb["mean_before"], "std": nb["std_before"]}
    summary |= {f"initial_{k}": v
                for k, v in evaluate(rm, held, lt, t.prefix, t.suffix, t.device, t.dtype, min_gap=gap).items()}
    cache = None
    if cfg.train_reward.epochs > 1 and frozen_depth(rm.lm) > 0:
        # LoRA in the top blocks only: run the frozen blocks below once for all epochs, if that fits in memory
        if prefix_bytes(rm, train, t.prefix, t.suffix) <= PREFIX_CACHE_BYTES:
            bar = progress(len(train), "reward model: frozen blocks")
            cache = reward_prefixes(rm, train, t.prefix, t.suffix, t.device, t.dtype,
                                    cfg.train_reward.microbatch or cfg.train_reward.batch_size, bar)  # fmt: skip
            bar.close()
    bar = progress(len(train) * cfg.train_reward.epochs, "training reward model")
    rm.train()
    last = train_epoch(rm, train, lt, cfg, t.prefix, t.suffix, t.device, t.dtype, log, bar, cache)
    del cache
    rm.eval()
    bar.close()
    # a regression is evaluated in the scores' units, before normalize_after rescales its output (the correlation and
    # the pair accuracy do not change with the scale)
    final = evaluate(rm, held, lt, t.prefix, t.suffix, t.device, t.dtype, min_gap=gap) if scales else None
    if cfg.train_reward.normalize_after:
        na = normalize(rm, t.model, t.tok, t.train_queries, cfg, t.prefix, t.suffix, gen, t.device, t.dtype)
        summary["norm_after"] = {"mean": na["mean_before"], "std": na["std_before"]}
    summary |= final or evaluate(rm, held, lt, t.prefix, t.suffix, t.device, t.dtype, min_gap=gap)
    summary |= {"final_minibatch": last, "seconds": time.time() - t0}
    if log is not None:
        # the wall-clock seconds under PPO's name for them (elapsed/time), which comparisons of runs leave out
        row = {("elapsed/time" if k == "seconds" else k): v for k, v in summary.items() if isinstance(v, float)}
        log.scalars(row, len(train) * cfg.train_reward.epochs, phase="reward")
    task = {k: getattr(cfg.task, k) for k in ("query_prefix", "query_suffix", "query_length", "response_length")}
    whole = rm
    if dist.is_sharded(rm):  # FSDP: the whole model gathered on rank 0 (a collective)
        from lmprefs.models.lm import plain_copy

        state = dist.full_state_dict(rm)
        whole = plain_copy(rm, state) if dist.is_main() else None
    extra = {"summary": summary, "label_type": lt.name, "task": task}
    if cfg.labels.type == "scalar_rating":
        extra["scores_as"] = cfg.labels.scores_as
    if dist.is_main():
        save_reward_model(whole, out_dir, extra=extra, merged=cfg.lora.merged_reward_model)
    dist.barrier()  # every rank may read it once this returns
    return rm, summary


def heldout_labels(cfg: Config, store, data) -> tuple[torch.Tensor, str]:
    """[N] bool: which of the store's labels `data` (load_examples) are held out, by labels.heldout_by, and what they
    measure (reward.split_heldout_mask). Every rank reads the same store, so all agree."""
    from lmprefs.training.reward import split_heldout_mask

    lab = cfg.labels
    by_item = {} if lab.heldout_by == "hash" else store.item_splits()
    splits = [by_item.get(i) for i in data.items.tolist()]
    if lab.heldout_by == "split" and all(s is None for s in splits):
        raise UserError(f"labels.heldout_by=split: none of the {len(data)} {lab.type} labels in the store carries an "
                        "imported split (import-labels --format summarize keeps one); use auto or hash")  # fmt: skip
    return split_heldout_mask(data.split_keys(), splits, cfg.run.seed, lab.heldout_fraction)


def training_label_type(cfg: Config):
    """The label type whose loss trains the reward model: labels.type, except that per-response scores compared
    within a prompt (labels.scores_as=comparisons) train as best_of_2 questions."""
    from lmprefs.labels.types import PickBest
    from lmprefs.labels.types import get as get_label_type

    return PickBest(2) if cfg.labels.scores_as == "comparisons" else get_label_type(cfg.labels.type)


def reward_frame(t: Task):
    """A reward model shaped as train_reward_model makes it, before training: with LoRA the 'reward' adapter on the
    shared base (which stays the initial policy with adapters off), else a copy of the initial model."""
    from lmprefs.models.lm import RewardModel

    cfg = t.cfg
    if cfg.lora.rank > 0:
        from lmprefs.models.lora import add_adapter

        add_adapter(t.model, cfg.lora, "reward", seed=cfg.run.seed)
        return RewardModel(t.model, t.tok, adapter="reward", seed=cfg.run.seed).to(t.device)
    return RewardModel(copy.deepcopy(t.model), t.tok, seed=cfg.run.seed).to(t.device)


class RewardState:
    """A reward model's weights as checkpoint state (PolicyRun.extras): head, gain and bias, and the trunk unless
    it is a LoRA adapter (the checkpoint's adapters.safetensors holds those weights, with the policy's). Resuming
    from it rebuilds the very model the uninterrupted run scored with, not the merged export in reward_model/."""

    def __init__(self, rm):
        self.rm = rm

    def state_dict(self) -> dict:
        rm = self.rm
        own = {f"head.{k}": v for k, v in rm.head.state_dict().items()} | {"gain": rm.gain, "bias": rm.bias}
        if rm.adapter is None:
            own |= {f"lm.{k}": v for k, v in rm.lm.state_dict().items()}
        return {k: v.detach().cpu().clone() for k, v in own.items()}

    def load_state_dict(self, s: dict) -> None:
        rm = self.rm
        with torch.no_grad():
            rm.head.load_state_dict({k[5:]: v for k, v in s.items() if k.startswith("head.")})
            rm.gain.copy_(s["gain"])
            rm.bias.copy_(s["bias"])
            if rm.adapter is None:
                rm.lm.load_state_dict({k[3:]: v for k, v in s.items() if k.startswith("lm.")})


def reward_function(reward) -> tuple[str, object]:
    """(name, fn) for a reward on response texts, fn(list[str]) -> list[float]: a callable (the Python API), a
    built-in name (vader, descriptiveness), or `module:function` naming one of the user's own."""
    import importlib

    from lmprefs.labels.labelers import SCORE_FNS, score_fn

    if callable(reward):
        mod, name = getattr(reward, "__module__", None), getattr(reward, "__qualname__", "")
        return (f"{mod}:{name}" if mod and "<" not in name else "callable"), reward
    if reward in SCORE_FNS:
        return reward, score_fn(reward)
    if ":" not in reward:
        raise UserError(f"--reward {reward!r}: choose model, {', '.join(sorted(SCORE_FNS))}, or module:function "
                        "(a function of a list of response texts returning a list of floats)")  # fmt: skip
    mod_name, _, fn_name = reward.partition(":")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except ImportError as e:
        raise UserError(f"--reward {reward}: cannot import {mod_name!r} ({e}); is it on PYTHONPATH?") from None
    except AttributeError:
        raise UserError(f"--reward {reward}: module {mod_name!r} has no {fn_name!r}") from None
    if not callable(fn):
        raise UserError(f"--reward {reward}: {fn_name!r} is not a function")
    return reward, fn


def reward_for_policy(t: Task, run_dir: Path, reward, store_path: str | None, resume: bool, log=None):
    """The score function PPO optimizes: a reward function (`--reward vader`, `--reward module:function`, a
    callable), a trained reward model (rewards.trained_model, or this run's reward_model/ when resuming), or a new
    one trained from the store. With LoRA a reward model trained in this run is an adapter on the policy's base;
    info["state"] is its RewardState for the checkpoint, and on resume (from a checkpoint) it is an empty frame the
    checkpoint fills."""
    from lmprefs.models.lm import is_reward_model_dir, load_reward_model
    from lmprefs.training.policy import rm_score_fn, text_score_fn

    cfg = t.cfg
    if reward is not None and reward != "model":
        reward, fn = reward_function(reward)
        # normalized like a reward model (mean 0, std 1 on initial-policy samples), so that kl_coef and the KL
        # target weigh it as they weigh a learned reward. VADER's std on those samples is 0.39 (quickstart preset),
        # and in `experiment mock-sentiment` raw VADER took the true reward from 0.166 to 0.308, normalized to 0.490
        # (a 1000-label reward model: 0.603; 2026-11-21)
        from lmprefs.tasks import decode
        from lmprefs.training.reward import normalization_samples

        gen = torch.Generator(device=t.device).manual_seed(dist.rank_seed(cfg.run.seed) + 2)
        q, r = normalization_samples(t.model, t.tok, t.train_queries, cfg, t.prefix, t.suffix, gen, t.device, t.dtype)
        raw = dist.gather_rows(_checked_scores(fn, decode(t.tok, r), reward, decode(t.tok, q)))
        mean, std = raw.mean().item(), max(raw.std(unbiased=False).item(), 1e-6)
        if dist.is_main():
            print(f"reward {reward}: normalized with mean {mean:+.4f}, std {std:.4f} of {len(raw)} initial-policy "
                  "samples", flush=True)  # fmt: skip
        return text_score_fn(lambda texts, queries: _checked_scores(fn, texts, reward, queries).tolist(), t.tok, mean,
                             std, t.prefix, t.suffix), {"reward": reward}  # fmt: skip
    rm_dir = Path(cfg.rewards.trained_model) if cfg.rewards.trained_model else run_dir / "reward_model"
    if cfg.rewards.trained_model and not is_reward_model_dir(rm_dir):
        raise UserError(f"rewards.trained_model={rm_dir}: not a reward-model directory (a sequence classifier "
                        "with num_labels=1, as train-reward or TRL's RewardTrainer save)")  # fmt: skip
    info = {"reward": "model", "reward_model": str(rm_dir)}
    if resume and cfg.lora.rank > 0 and not cfg.rewards.trained_model:
        rm = reward_frame(t).eval().freeze()
        return rm_score_fn(rm), info | {"state": RewardState(rm)}
    if is_reward_model_dir(rm_dir) and (cfg.rewards.trained_model or resume):
        check_same_tokenizer(rm_dir, t.tok, f"rewards.trained_model={rm_dir}")
        rm = load_reward_model(rm_dir, t.device).eval().requires_grad_(False)
        if cfg.run.parallel == "fsdp":  # scored through its forward: FSDP gathers a block at a time
            rm = dist.wrap(rm, "fsdp", t.dtype)
        return rm_score_fn(rm), info
    store = label_source(store_path or cfg.labels.source or "labels.sqlite")
    from lmprefs.runlog import open_logger

    # a reward model trained here logs into the run directory (phase "reward"), as PPO does after it; rank 0 only
    own_log = log is None
    log = open_logger(run_dir, cfg) if own_log else log
    try:
        rm, summary = train_reward_model(t, store, rm_dir, log)
    finally:
        if own_log:
            log.close()
    rm.freeze()
    info["reward_training"] = summary
    return rm_score_fn(rm), info | ({"state": RewardState(rm)} if rm.adapter else {})


def _checked_scores(fn, texts: list[str], name: str, queries: list[str] | None = None) -> torch.Tensor:
    """fn(texts) (or fn(texts, queries) for a judge that reads the query) as float64 [len(texts)], or a UserError
    saying what the reward function returned instead."""
    from lmprefs.labels.labelers import score_texts

    try:
        out = torch.tensor([float(x) for x in score_texts(fn, texts, queries)], dtype=torch.float64)
    except (TypeError, ValueError) as e:
        raise UserError(f"reward {name}: must return a list of floats, one per text ({e})") from None
    if out.shape != (len(texts),) or not torch.isfinite(out).all():
        raise UserError(f"reward {name}: returned {tuple(out.shape)} values for {len(texts)} texts, or non-finite "
                        "ones")  # fmt: skip
    return out


def check_same_tokenizer(model_dir: Path, tok, what: str) -> None:
    """A reward model reads the policy's token ids as they are, so it must share the policy's vocabulary: another
    tokenizer's ids would index the wrong embeddings (or past the end of them, an IndexError deep in torch)."""
    from transformers import AutoTokenizer

    try:
        other = AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError) as e:
        why = str(e).splitlines()[0][:100]
        raise UserError(f"{what}: no tokenizer to compare with the policy's ({why})") from None
    if other.get_vocab() != tok.get_vocab():
        raise UserError(f"{what}: its tokenizer ({len(other)} tokens) differs from the policy's "
                        f"({len(tok)} tokens, task.initial_model); train the reward model on the same base model")


def track_true_reward(score_fn, true_fn, tok, prefix: list[int] = (), suffix: list[int] = ()):
    """(score_fn, on_update): the same scores, plus objective/true_reward (the true reward of each rollout's
    truncated responses) added to every update's metrics, for curves of what the reward model stands in for.
    `prefix`/`suffix`: the task's, around the rollout's queries (a judge that reads the query gets the query alone)."""
    from lmprefs.labels.labelers import score_texts
    from lmprefs.tasks import decode, query_texts

    last: dict[str, float] = {}

    def score(q, r, frozen=None):
        last["v"] = sum(score_texts(true_fn, decode(tok, r), query_texts(tok, q, prefix, suffix))) / len(r)
        return score_fn(q, r, frozen)

    def on_update(_, stats):
        stats["objective/true_reward"] = last.get("v", float("nan"))

    return score, on_update


def policy_for(t: Task):
    from lmprefs.models.lm import Policy

    cfg = t.cfg
    separate = cfg.ppo.value_model == "separate"
    if cfg.lora.rank > 0:  # policy (and value) adapters on the shared base
        from lmprefs.models.lora import add_adapter

        add_adapter(t.model, cfg.lora, "policy", seed=cfg.run.seed + 3)
        if separate:
            add_adapter(t.model, cfg.lora, "value", seed=cfg.run.seed + 4)
        return Policy(t.model, t.tok, cfg.task.temperature, adapter="policy",
                      value_adapter="value" if separate else None).to(t.device)  # fmt: skip
    value_lm = copy.deepcopy(t.model) if separate else None
    return Policy(copy.deepcopy(t.model), t.tok, cfg.task.temperature, value_lm=value_lm).to(t.device)


def run_train_policy(cfg: Config, run_dir: Path, **kw) -> dict:
    """train-policy end to end: reward, policy, PPO with checkpoints; resumes from run_dir/checkpoint. The run
    directory is locked for the duration (one process per run). Arguments: _train_policy_locked."""
    import contextlib

    from lmprefs.checkpoint import run_lock

    run_dir = Path(run_dir)
    fresh = not run_dir.exists()
    try:
        # rank 0 holds the lock for all ranks of a launch (they are one run)
        with run_lock(run_dir) if dist.is_main() else contextlib.nullcontext():
            return _train_policy_locked(cfg, run_dir, **kw)
    except UserError:
        if fresh and dist.is_main() and run_dir.is_dir() and [p.name for p in run_dir.iterdir()] == [".lock"]:
            (run_dir / ".lock").unlink()  # a start refused before any work leaves no directory behind
            run_dir.rmdir()
        raise


def _train_policy_locked(cfg: Config, run_dir: Path, *, reward: str | None = None, store_path: str | None = None,
                         resume: bool = False, t: Task | None = None, true_reward: str | None = None,
                         online: bool = False, labeler: str | None = None, preset: str | None = None,
                         changes: list[str] | None = None) -> dict:  # fmt: skip
    """online: judgments are requested from the current policy during training and the reward model is retrained.
    resume without a checkpoint starts the run over in the same directory. changes: with resume, continue a run
    the andon cord stopped from its last good checkpoint with this changed config ('key old -> new' lines)."""
    import json

    from lmprefs.checkpoint import flat_config, math_changes
    from lmprefs.overrides import atomic_write_text
    from lmprefs.queries import QueryStream
    from lmprefs.runlog import open_logger
    from lmprefs.training.policy import build_run, find_checkpoint, load_checkpoint, train_policy

    meta_path = run_dir / "run.json"  # what the command line chose beyond the config, so --resume repeats it
    found, andon = None, {}
    if resume:
        meta = resume_meta(run_dir, reward=reward, online=online, labeler=labeler, store_path=store_path,
                           preset=preset)  # fmt: skip
        reward, online, labeler, store_path = meta["reward"], meta["online"], meta.get("labeler"), meta.get("store")
        found = find_checkpoint(run_dir)
        andon = check_andon(run_dir, found, changes)
        if found is not None and changes is None:
            diff = math_changes(found[1].get("config", {}), flat_config(cfg))
            if diff:
                raise UserError(f"--resume: {run_dir}/config.json differs from the config its checkpoint was trained "
                                f"with ({'; '.join(diff[:3])}); restore it, or start a new --run-dir")  # fmt: skip
        if found is None:
            print(f"{run_dir} has no checkpoint yet: starting the run over from update 0", flush=True)
    else:
        held = [n for n in ("run.json", "metrics.jsonl", "checkpoint") if (run_dir / n).exists()]
        if held:
            raise UserError(f"{run_dir} already holds a run ({held[0]}); pass --resume to continue it or choose "
                            "another --run-dir")  # fmt: skip
        meta = {}
    dist.barrier()  # every rank has checked the run directory before rank 0 writes into it
    t = t or setup_task(cfg)
    hooks, extras = [], {}
    if online and dist.world() > 1:
        raise UserError(f"--online runs in one process for now; launch it without torchrun ({dist.world()} ranks)")
    if online:
        from lmprefs.training.online import OnlineRewards

        if reward and reward != "model":
            raise UserError(f"--online learns a reward model from judgments; it cannot use --reward {reward}")
        run_dir.mkdir(parents=True, exist_ok=True)
        store_path = str(Path(store_path or cfg.labels.source or run_dir / "labels.sqlite").resolve())
        onl = OnlineRewards(t, open_store(store_path), run_dir, labeler)
        onl.start(found is not None)
        score_fn, info, reward = onl.score, {"reward": "model", "store": store_path}, "model"
        hooks.append(onl.on_update)
        extras["online"] = onl
    else:
        score_fn, info = reward_for_policy(t, run_dir, reward, store_path, found is not None)
        if "state" in info:
            extras["reward"] = info.pop("state")
    if true_reward:
        # a built-in judge or the user's module:function, as --reward takes them
        score_fn, track = track_true_reward(score_fn, reward_function(true_reward)[1], t.tok, t.prefix, t.suffix)
        hooks.append(track)
    policy = policy_for(t)
    run = build_run(cfg, policy, QueryStream(t.train_queries, cfg.run.seed, dist.rank(), dist.world()), t.device)
    run.extras.update(extras)
    if found is not None:
        load_checkpoint(run, run_dir, found)
        if dist.is_main():
            print(f"resuming {run_dir} at update {run.update}/{cfg.ppo.num_updates}", flush=True)
    log = open_logger(run_dir, cfg, resume_step=run.update if resume else None)
    if not resume and dist.is_main():
        meta = {"reward": reward or "model", "online": online, "labeler": labeler, "preset": preset,
                "store": str(Path(store_path).resolve()) if store_path else None}  # fmt: skip
        atomic_write_text(meta_path, json.dumps(meta | {k: v for k, v in info.items() if isinstance(v, str)}))
    # continuing after an andon stop: what stopped it and what was changed, for the record (rank 0 writes it)
    if changes is not None and dist.is_main():
        meta.setdefault("continued_after_andon", []).append({**andon, "resumed_at": run.update, "changes": changes})
        atomic_write_text(meta_path, json.dumps(meta))
        (run_dir / "ANDON").unlink(missing_ok=True)
    try:
        stats = train_policy(cfg, run, score_fn, log, run_dir, t.prefix, t.suffix, t.device, t.dtype,
                             lambda r, st: [h(r, st) for h in hooks])  # fmt: skip
    finally:
        log.close()
    if online:
        from lmprefs.training.online import online_summary

        info["online_summary"] = online_summary(run_dir)
    return {"stats": stats, **info, "run": run, "task": t}


def resume_meta(run_dir: Path, *, reward, online, labeler, store_path, preset) -> dict:
    """run.json of the run to resume, after refusing command-line choices that differ from what it was started
    with (they would change what it computes); says what it ignores."""
    import json

    path = run_dir / "run.json"
    if not path.is_file():
        raise UserError(f"--resume: {run_dir} holds no train-policy run (no run.json); start without --resume")
    meta = json.loads(path.read_text())
    if meta.get("reward") == "online":  # run.json of an older lmprefs
        meta["reward"], meta["online"] = "model", True
    meta["online"] = bool(meta.get("online"))
    if online and not meta["online"]:
        raise UserError(f"--resume --online: the run in {run_dir} was not started with --online; start a new "
                        "--run-dir")  # fmt: skip
    given = {"--reward": reward, "preset": preset}
    if meta["online"]:
        given |= {"--labeler": labeler, "--db": str(Path(store_path).resolve()) if store_path else None}
    elif store_path and str(Path(store_path).resolve()) != meta.get("store"):
        print(f"--resume: ignoring --db {store_path} (the run's reward model is reused)", flush=True)
    saved = {"--reward": meta.get("reward"), "preset": meta.get("preset"), "--labeler": meta.get("labeler"),
             "--db": meta.get("store")}  # fmt: skip
    for flag, value in given.items():
        if value is not None and saved[flag] is not None and value != saved[flag]:
            raise UserError(f"--resume: the run in {run_dir} was started with {flag} {saved[flag]}, not {value}; "
                            "resuming cannot change what it computes (start a new --run-dir)")  # fmt: skip
    return meta


def check_andon(run_dir: Path, found, changes: list[str] | None) -> dict:
    """The andon record of a run the cord stopped ({} if none); refuses to resume it unless told to continue
    from the last good state with a changed config."""
    import json

    path = run_dir / "ANDON"
    andon = json.loads(path.read_text()) if path.is_file() else {}
    if andon and changes is None:
        last = f"update {found[1]['update']}" if found else "none was saved"
        raise UserError(f"--resume: the run stopped itself at update {andon.get('update')}: {andon.get('reason')}; "
                        f"its last good checkpoint: {last}. Resuming as it was would repeat that; to continue from "
                        "it with a change, pass --continue-after-andon and the change (e.g. --ppo.lr 5e-5)")
    if changes is not None and not andon:
        raise UserError(f"--continue-after-andon: the run in {run_dir} was not stopped by the andon cord (no ANDON)")
    if changes is not None and not changes:
        raise UserError("--continue-after-andon needs a change to the config that made the run stop "
                        "(e.g. --ppo.lr 5e-5)")  # fmt: skip
    return andon
