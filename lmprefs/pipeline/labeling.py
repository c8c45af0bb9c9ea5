"""Labeling: best-of-N questions sampled from the initial policy into a label store, answered by a simulated
labeler or queued for people; label files as a store."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from lmprefs.data.hf_datasets import is_saved_dataset, split_spec
from lmprefs.data.tasks import decode, stop_tokens
from lmprefs.errors import UserError
from lmprefs.io.atomic import crash_point
from lmprefs.io.inputs import input_file
from lmprefs.labels.formats import LabelFileError, import_file
from lmprefs.labels.labelers import label_items, make_labeler, score_fn
from lmprefs.labels.store import LabelStore, check_store_path
from lmprefs.labels.types import get as get_label_type
from lmprefs.models.loading import hidden_size
from lmprefs.models.lora import adapter_start, using
from lmprefs.models.sampling import sampler_options
from lmprefs.pipeline.selection import Chooser, pool_size
from lmprefs.pipeline.task import Task
from lmprefs.runtime import distributed as dist
from lmprefs.runtime.runlog import progress
from lmprefs.training.prefix_share import SharedPrefixes
from lmprefs.training.question_prefixes import PREFIX_CACHE_BYTES
from lmprefs.training.reward import sample_comparisons, tokenizer_id


def open_store(path: str | Path):
    return LabelStore(check_store_path(path, must_exist=False))


def label_source(source: str):
    """A label store from a .sqlite path, or a temporary store holding an imported label file (removed when the
    store is collected or the process exits)."""
    p = Path(source)
    if p.suffix in (".sqlite", ".db"):
        return LabelStore(check_store_path(p, must_exist=True))
    if not is_saved_dataset(split_spec(source)[0]):
        input_file(p, "label source")
    store = LabelStore.temporary()
    try:
        import_file(store, p)
    except LabelFileError as e:
        raise UserError(str(e)) from None
    return store


def collect_labels(t: Task, store, n: int, *, labeler: str | None = None, source: str = "lmprefs label",
                   batch: str | None = None, seed: int | None = None, queries: torch.Tensor | None = None,
                   model=None, adapter: str | None = None, keep_prefixes: bool = False,
                   choose: Chooser | None = None) -> dict:  # fmt: skip
    """Sample `n` questions of N continuations from the initial policy (or `model` with `adapter`: the current
    policy, in online mode), put them in the store, and have the simulated labeler judge them ('none': queue them
    for people). Returns counts and timings.
    Under several ranks each samples a strided share of the questions with its own seed, and rank 0 alone writes
    them all (in the order one process would) and labels them; `store` may be None on the other ranks.
    keep_prefixes: also return, as "prefixes", the sampling pass's frozen prefixes of the questions' rows below the
    blocks that lora gives adapters (`SharedPrefixes`, for train_reward_model through t.shared_prefixes), so that
    a reward model trained on these labels in this process runs only its adapted blocks; None in one process of
    several, without frozen blocks, or beyond PREFIX_CACHE_BYTES.
    choose: directed selection (pipeline/selection.py): pool_size(n) candidate questions are sampled as `n` would
    be, and the `n` it picks are stored, in the order picked, with their acquisition scores (no prefixes kept)."""

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
    wanted, n = n, (n if choose is None else pool_size(cfg.labels, n))  # n: the questions sampled
    # each query once per round, in a fresh order each round: more questions than queries (300 news articles) ask
    # about some queries again, with new samples (the original's labels also share queries)
    g = torch.Generator().manual_seed(seed + 17)
    pick = torch.cat([torch.randperm(len(pool), generator=g) for _ in range(-(-n // len(pool)))])[:n]
    q = pool[pick]
    gen = torch.Generator(device=t.device).manual_seed(dist.rank_seed(seed))
    t0 = time.time()

    bar = progress(n, "sampling comparisons" if choose is None else f"sampling {n} candidate questions")
    model = t.model if model is None else model
    depth = adapter_start(model, cfg.lora) if keep_prefixes and dist.world() == 1 and choose is None else 0
    L = t.ctx.format(q[:1]).shape[1] + cfg.task.response_length
    if depth and n * S * L * hidden_size(model) * 4 > PREFIX_CACHE_BYTES:  # fp32, as label_prefixes bounds them
        depth = 0
    with using(model, adapter):
        samples, hidden = sample_comparisons(model, t.tok, dist.shard(q), cfg.task, t.ctx, S,
                                             batch_size=max(1, cfg.train_reward.rollout_batch_size // dist.world()),
                                             gen=gen, on_batch=lambda k: bar.update(k * dist.world()),
                                             sampler=sampler_options(cfg.run), prefix_depth=depth)  # fmt: skip
    bar.close()
    if dist.world() > 1:
        samples = dist.interleave(dist.all_gather_objects(samples))  # [n, S, T], question i from rank i % W
    t_sample = time.time() - t0
    if not dist.is_main():  # rank 0 writes and labels; the others wait for the store to be complete
        dist.barrier()
        return {"items": min(n, wanted), "labels_added": 0, "labeler": labeler or cfg.labels.labeler,
                "sample_seconds": t_sample,
                "seconds": time.time() - t0}  # fmt: skip
    rows = torch.arange(n)  # which sampled questions are stored, in order
    acq = None
    if choose is not None:
        crash_point("select:sampled")
        rows, acq = choose(q, samples, wanted)
        q, samples, n = q[rows], samples[rows], len(rows)
    item_ids = store_questions(t, store, q, samples, [f"{seed}:{r}" for r in rows.tolist()], source=source,
                               batch=batch, scores=None if acq is None else acq[rows].tolist(),
                               by=choose.describe if choose is not None else "")  # fmt: skip
    crash_point("labeling:stored")
    added = 0
    if name != "none":
        sim = make_labeler(name, cfg.labels.labeler_temperature, cfg.labels.labeler_random_rate, seed)
        items = [store.get_item(i) for i in item_ids]
        added = label_items(store, sim, name, items)
    dist.barrier()
    prefixes = None
    if hidden is not None:
        prefixes = SharedPrefixes(depth, {item: i for i, item in enumerate(item_ids)}, q, samples, hidden)
    out = {"items": n, "labels_added": added, "labeler": name, "sample_seconds": t_sample,
           "seconds": time.time() - t0, "prefixes": prefixes}  # fmt: skip
    if acq is not None:  # what the asked questions' acquisition was, against the pool's
        out |= {"candidates": len(acq), "acquisition_asked": float(acq[rows].mean()) if len(rows) else 0.0,
                "acquisition_pool": float(acq.mean())}  # fmt: skip
    return out


def store_questions(t: Task, store, q: torch.Tensor, samples: torch.Tensor, keys: list[str], *, source: str,
                    batch: str | None, scores: list[float] | None = None, by: str = "") -> list[int]:  # fmt: skip
    """Questions queries [n, Q] and samples [n, S, T] into the store in one transaction, with their token ids, each
    under its `keys` entry (a question stored again is the same item), and with `scores` their acquisition scores
    (`by`: what computed them). -> the item ids."""
    cfg = t.cfg
    tok_name, stop = tokenizer_id(t.tok), stop_tokens(cfg.task, t.tok)
    q_text = decode(t.tok, q)
    item_ids = []
    with store.transaction():
        for i in range(len(q)):
            ids = [[x for x in s if x >= 0] for s in samples[i].tolist()]
            item_ids.append(store.add_item(
                q_text[i], decode(t.tok, samples[i], stop), source=source, label_type=cfg.labels.type,
                query_tokens=[x for x in q[i].tolist() if x >= 0], sample_tokens=ids, tokenizer=tok_name,
                batch=batch, key=keys[i],
            ))  # fmt: skip
        if scores is not None:
            store.set_acquisition(dict(zip(item_ids, scores, strict=True)), by=by)
    return item_ids
