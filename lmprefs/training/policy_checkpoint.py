"""A policy run's checkpoints: written atomically (the policy, its optimizers, the KL controller, every rank's
generators and query-stream position), found and verified on resume, so that a killed run continues bitwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lmprefs.config import Config
from lmprefs.config.diff import config_meta
from lmprefs.errors import UserError
from lmprefs.io.publish import DamagedDirectory, latest_good
from lmprefs.models import parallel
from lmprefs.models.artifacts import _save_policy, atomic_dir, plain_copy
from lmprefs.models.lora import adapter_state
from lmprefs.models.policy import Policy
from lmprefs.runtime import distributed as dist
from lmprefs.training.policy_run import AndonStop, PolicyRun, nonfinite_parameters

RANK_STATE_FILE = "ranks.pt"  # every rank's generators and query-stream position, and the world size


def rank_states(run: PolicyRun) -> dict:
    """What differs between ranks, gathered from all of them (a collective: every rank calls it)."""
    mine = {"stream": run.stream.state_dict(), "gen_sample": run.gen_sample.get_state(),
            "gen_ppo": run.gen_ppo.get_state()}  # fmt: skip
    return {"world_size": dist.world(), "ranks": dist.all_gather_objects(mine)}


def load_rank_state(run: PolicyRun, ckpt: Path) -> None:
    """This rank's part of rank_states; refuses a checkpoint written by another number of ranks."""
    path = Path(ckpt) / RANK_STATE_FILE
    saved: dict[str, Any] = torch.load(path, weights_only=True) if path.is_file() else {"world_size": 1, "ranks": None}
    if saved["world_size"] != dist.world():
        raise UserError(f"--resume: the checkpoint in {Path(ckpt).parent} was written by {saved['world_size']} "
                        f"rank(s) and this launch has {dist.world()}; resume with the same number of processes "
                        f"(torchrun --nproc-per-node/--nnodes giving WORLD_SIZE={saved['world_size']})")  # fmt: skip
    if saved["ranks"] is not None:
        s = saved["ranks"][dist.rank()]
        run.stream.load_state_dict(s["stream"])
        run.gen_sample.set_state(s["gen_sample"])
        run.gen_ppo.set_state(s["gen_ppo"])


def save_checkpoint(run: PolicyRun, run_dir: Path, cfg: Config | None = None) -> None:
    """A new version of checkpoint/ (policy/ as a HF directory + value head, state.pt, ranks.pt, and with LoRA the
    exact adapter weights), published atomically with a manifest by rank 0; the previous version stays for
    fallback. Every rank calls it (their own states are gathered). Non-finite parameters are never saved."""
    from safetensors.torch import save_file

    bad = nonfinite_parameters(run)
    if bad:
        raise AndonStop(f"refusing to save a checkpoint: {bad}")
    # which extras state.pt holds, for a resume to know before it loads state.pt (a reward model kept whole or not)
    meta = {"update": run.update, "extras": sorted(run.extras), **(config_meta(cfg) if cfg is not None else {})}
    ranks = rank_states(run)
    policy: Policy | None
    policy, optimizer = run.policy, None
    if parallel.is_sharded(run.policy):  # FSDP: the whole model and optimizer state gathered on rank 0 (collectives)
        model_state = parallel.full_state_dict(run.policy)
        optimizer = parallel.full_optimizer_state(run.policy, run.optimizer)
        if dist.is_main():
            assert model_state is not None  # rank 0 holds the gathered state
            policy = plain_copy(run.policy, model_state)
        else:
            policy = None
    run.saved_update = run.update
    if not dist.is_main():
        return
    assert policy is not None  # rank 0 keeps its policy, plain or gathered
    with atomic_dir(Path(run_dir) / "checkpoint", meta, keep=1) as tmp:
        torch.save(ranks, tmp / RANK_STATE_FILE)
        _save_policy(policy, tmp / "policy")
        if run.policy.adapter:  # the exact adapter weights; the merged export above is for sampling
            save_file(adapter_state(run.policy.lm), tmp / "adapters.safetensors")
        state = run.state_dict()
        if optimizer is not None:  # keyed by parameter name (get_optimizer_state_dict), not by position
            state["optimizer"] = optimizer
        torch.save(state, tmp / "state.pt")
    run.saved_update = run.update


def find_checkpoint(run_dir: Path) -> tuple[Path, dict] | None:
    """(newest checkpoint version that verifies, its manifest), or None when the run never saved one. A version whose
    state is of another update than its manifest says is damaged too: set aside, and the one before it used."""
    return latest_good(Path(run_dir) / "checkpoint", check=_state_of_its_update)


def _state_of_its_update(ckpt: Path, manifest: dict) -> None:
    state = torch.load(ckpt / "state.pt", weights_only=True, mmap=True)
    if state.get("update") != manifest.get("update"):
        raise DamagedDirectory(f"{ckpt}: state.pt is of update {state.get('update')}, its manifest of "
                               f"{manifest.get('update')}")  # fmt: skip


def load_checkpoint(run: PolicyRun, run_dir: Path, found: tuple[Path, dict] | None = None) -> dict:
    """Load the newest good checkpoint of run_dir into `run` (or `found`, from find_checkpoint); its manifest."""
    from safetensors.torch import load_file

    found = found or find_checkpoint(run_dir)
    if found is None:
        raise UserError(f"--resume: {run_dir} has no checkpoint")
    ckpt, manifest = found
    state = torch.load(ckpt / "state.pt", weights_only=True)
    if run.policy.adapter:
        run.policy.lm.load_state_dict(load_file(ckpt / "adapters.safetensors"), strict=False)
        run.policy.value_head.load_state_dict(load_file(ckpt / "policy" / "value_head.safetensors"))
        run.load_state_dict(state)
        load_rank_state(run, ckpt)
        run.saved_update = run.update
        return manifest
    src = load_file(ckpt / "policy" / "model.safetensors")
    lm_state = run.policy.lm.state_dict()
    missing = [k for k in lm_state if k not in src and not _tied(run.policy.lm, k)]
    if missing:
        raise UserError(f"checkpoint in {run_dir} does not match the model (missing {missing[:3]})")
    whole = _whole(run.policy.lm, src, "lm.")
    whole |= {f"value_head.{k}": v for k, v in load_file(ckpt / "policy" / "value_head.safetensors").items()}
    if run.policy.value_lm is not None:
        value = load_file(ckpt / "policy" / "value_model" / "model.safetensors")
        whole |= _whole(run.policy.value_lm, value, "value_lm.")
    sharded = parallel.is_sharded(run.policy)
    state = {**state, "optimizer": _optimizer_keys(run.policy, state["optimizer"], by_name=sharded)}
    if sharded:  # every rank keeps its shards of the whole (set_model_state_dict)
        parallel.load_full_state_dict(run.policy, whole)
        parallel.load_full_optimizer_state(run.policy, run.optimizer, state["optimizer"])
        state["optimizer"] = None
    else:
        run.policy.load_state_dict(whole)
    run.load_state_dict(state)
    load_rank_state(run, ckpt)
    run.saved_update = run.update
    return manifest


def _tied(model, key: str) -> bool:
    return key.endswith("lm_head.weight") and getattr(model.config, "tie_word_embeddings", False)


def _optimizer_keys(policy: Policy, saved: dict, by_name: bool) -> dict:
    """An optimizer state dict keyed by parameter name (FSDP's get_optimizer_state_dict) or by position (torch's
    own), from either: a run continued after an andon stop may change run.parallel."""
    names = [n for n, p in policy.named_parameters() if p.requires_grad]  # trainable_parameters' order
    if not saved["param_groups"] or isinstance(saved["param_groups"][0]["params"][0], str) == by_name:
        return saved
    to = {n: i for i, n in enumerate(names)} if not by_name else dict(enumerate(names))
    return {"state": {to[k]: v for k, v in saved["state"].items()},
            "param_groups": [{**g, "params": [to[k] for k in g["params"]]} for g in saved["param_groups"]]}


def _whole(model, src: dict, prefix: str) -> dict:
    """`model`'s state dict from saved tensors `src`, under `prefix`; a tied output embedding, which
    save_pretrained writes once, takes the input embedding's tensor."""
    emb = model.get_input_embeddings().weight
    emb_name = next(n for n, p in model.named_parameters() if p is emb)
    return {prefix + k: src[k] if k in src else src[emb_name] for k in model.state_dict()}
