"""`lmprefs push`: a run's final policy and reward model, with their model cards, to the Hugging Face hub (or to a
local folder standing in for it: LMPREFS_HUB_DIR or --hub-dir, where REPO becomes DIR/REPO).

What goes up is the model as others load it: weights, configs, tokenizer, adapters, value head, lmprefs.json and
README.md. Never the run's optimizer state, checkpoints, logs or labels (they live beside these directories, not in
them), nor the crash-safety manifest (its hashes would not match the card push completes). Every check that can fail
(the run, the names, offline mode, a token, the repos) runs before the first byte is uploaded, and each repo is
one commit, so a refused push leaves nothing behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from lmprefs.errors import UserError, first_line
from lmprefs.io.atomic import as_created
from lmprefs.io.run_owner import owner
from lmprefs.models.model_card import HERE

WHAT = ("policy", "reward-model", "all")
DIRS = {"policy": "policy", "reward-model": "reward_model"}
SKIPPED = {"manifest.json", ".write-probe"}
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?$")
HUB_DIR_ENV = "LMPREFS_HUB_DIR"


@dataclass(frozen=True)
class Upload:
    what: str  # policy, reward-model
    source: Path  # the run's directory
    repo: str


def plan(run: Path, repo: str, what: str) -> list[Upload]:
    """The uploads `lmprefs push RUN --repo REPO --what WHAT` makes: the policy to REPO, the reward model to REPO
    (alone) or REPO-reward-model (with the policy); refused in one line before anything is read further."""
    if not REPO_ID.match(repo) or ".." in repo or repo.endswith((".git", ".")):
        raise UserError(f"--repo {repo!r}: not a hub repo name (NAME or OWNER/NAME: letters, digits, - _ .)")
    if run.name in ("policy", "reward_model", "sft_model") and (run.parent / "config.json").is_file():
        raise UserError(f"RUN {run}: a model inside the run {run.parent}; push the run directory: lmprefs push "
                        f"{run.parent} --repo {repo}")  # fmt: skip
    if not (run / "config.json").is_file():
        raise UserError(f"RUN {run}: not a run directory (no config.json)")
    if what in ("policy", "all") and not _saved(run / "policy"):
        made_by = owner(run)
        if made_by == "train-reward":
            raise UserError(f"RUN {run}: a run of `lmprefs train-reward`, with a reward model and no policy; push "
                            "its reward model with --what reward-model")  # fmt: skip
        if made_by not in (None, "train-policy", "train-dpo", "quickstart"):
            raise UserError(f"RUN {run}: a run of `lmprefs {made_by}`, which trains no policy that push uploads "
                            "(the policy of a train-policy, train-dpo or quickstart run)")  # fmt: skip
        raise UserError(f"RUN {run}: not a finished run (no final policy in {run / 'policy'}); push it once it ends")
    if what == "reward-model" and not _saved(run / "reward_model"):
        raise UserError(f"RUN {run}: holds no reward model (no {run / 'reward_model'})")
    ups = []
    if what in ("policy", "all"):
        ups.append(Upload("policy", run / "policy", repo))
    if what == "reward-model" or (what == "all" and _saved(run / "reward_model")):
        ups.append(Upload("reward-model", run / "reward_model", repo if what == "reward-model" else
                          f"{repo}-reward-model"))  # fmt: skip
    for up in ups:
        _check_whole(up.source, f"RUN {run}")
    return ups


# a model directory's weights: a full model (one file or shards), or LoRA adapters (a policy's adapter/, a reward
# model's own adapter files)
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "adapter",
           "adapter_model.safetensors")


def _check_whole(d: Path, named: str) -> None:
    """A model directory as it was written: every file its manifest lists, unchanged, and its weights (a directory
    from before manifests has only the weights to check); else one line, before anything is uploaded."""
    from lmprefs.io.publish import MANIFEST, DamagedDirectory, verify

    try:
        if (d / MANIFEST).is_file():
            verify(d)
    except DamagedDirectory as e:
        raise UserError(f"{named}: {e}; nothing was uploaded") from None
    if not any((d / w).exists() for w in WEIGHTS):
        raise UserError(f"{named}: {d} holds no weights (none of {', '.join(WEIGHTS)}); nothing was uploaded")


def _saved(d: Path) -> bool:
    return d.is_dir() and ((d / "lmprefs.json").is_file() or (d / "config.json").is_file())


def stage(up: Upload, run: Path, into: Path) -> list[str]:
    """A copy of up.source in `into` as it will be uploaded: the card names the repo in its snippets (and, for the
    policy, gains the run's held-out evaluation where quickstart wrote one), lmprefs.json drops this machine's path
    of a local base. Returns the files, relative, sorted."""
    files = sorted(str(p.relative_to(up.source)) for p in up.source.rglob("*")
                   if p.is_file() and p.name not in SKIPPED)  # fmt: skip
    for f in files:
        (into / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(up.source / f, into / f)
    card = into / "README.md"
    if card.is_file():
        text = card.read_text().replace(HERE, up.repo)
        section = evaluation_section(run) if up.what == "policy" else ""
        card.write_text(text.replace("## How to load", section + "## How to load", 1) if section else text)
    meta = into / "lmprefs.json"
    if meta.is_file():
        data = json.loads(meta.read_text())
        data.pop("base_path", None)
        meta.write_text(json.dumps(data, indent=1))
    return files


def evaluation_section(run: Path) -> str:
    """The card's section for the run's held-out evaluation (quickstart's report.json), or "" where it has none."""
    try:
        rep = json.loads((run / "report.json").read_text())
        before, after = rep["true_reward_before"], rep["true_reward_after"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    gain = after["mean"] - before["mean"]
    kl = (rep.get("kl_after") or {}).get("kl")
    rows = [f"| true reward, base | {before['mean']:+.4f} +/- {before['stderr']:.4f} |",
            f"| true reward, this policy | {after['mean']:+.4f} +/- {after['stderr']:.4f} |",
            f"| gain | {gain:+.4f} |"] + ([f"| KL from the base (nats) | {kl:.2f} |"] if kl is not None else [])
    return ("## Evaluation\n\nOn " + f"{after.get('n_queries', '?')} held-out queries (the run's report.md):\n\n"
            + "| | mean +/- s.e. over queries |\n|---|---|\n" + "\n".join(rows) + "\n\n")


def push_run(run: Path, repo: str, what: str, private: bool, hub_dir: str | None, *,
             hub_named: str | None = None) -> list[tuple[Upload, list[str]]]:  # fmt: skip
    """Stage every upload, then copy each to the hub stand-in, or check the hub and upload each as one commit.
    hub_named: how a refusal names hub_dir (default "--hub-dir DIR")."""
    ups = plan(run, repo, what)
    with tempfile.TemporaryDirectory(prefix="lmprefs-push-") as tmp:
        staged = []
        for i, up in enumerate(ups):
            (Path(tmp) / str(i)).mkdir()
            staged.append((up, Path(tmp) / str(i), stage(up, run, Path(tmp) / str(i))))
        ids = {}
        if hub_dir:
            _make_folders(Path(hub_dir), ups, hub_named or f"--hub-dir {hub_dir}")
            for up, d, _ in staged:
                _copy_to_stand_in(d, Path(hub_dir) / up.repo)
        else:
            ids = _upload(staged, private)
    return [(replace(up, repo=ids.get(up.repo, up.repo)), files) for up, _, files in staged]


def _make_folders(hub: Path, ups: list[Upload], named: str) -> None:
    """Each repo's folder in the stand-in, made before any repo is copied: one that cannot be made (a read-only
    place, /proc) is one line, with nothing copied."""
    for up in ups:
        parent = (hub / up.repo).parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"{named}: cannot make {parent} ({e.strerror}); nothing was copied") from None


def _copy_to_stand_in(src: Path, dest: Path) -> None:
    """A repo in the local stand-in replaced whole, by a rename: never half a copy."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    shutil.copytree(src, tmp, dirs_exist_ok=True)
    as_created(tmp)  # not mkdtemp's 0700
    old = dest.with_name(f".{dest.name}.old") if dest.exists() else None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
        dest.rename(old)
    tmp.rename(dest)
    if old is not None:
        shutil.rmtree(old)


def _upload(staged: list, private: bool) -> dict[str, str]:
    """Upload each staged directory as one commit; returns each repo's full id (OWNER/NAME) by the name given."""
    import huggingface_hub
    from huggingface_hub import HfApi

    names = " and ".join(up.repo for up, _, _ in staged)
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true") or getattr(
            huggingface_hub.constants, "HF_HUB_OFFLINE", False):  # fmt: skip
        raise UserError(f"cannot push {names}: the hub is offline here (HF_HUB_OFFLINE is set); nothing was uploaded")
    if not huggingface_hub.get_token():
        raise UserError(f"cannot push {names}: no Hugging Face token (run `hf auth login` or set HF_TOKEN); nothing "
                        "was uploaded")  # fmt: skip
    api = HfApi()
    ids: dict[str, str] = {}
    try:
        for up, _, _ in staged:  # a bare NAME lands in the token's namespace: upload to the id the hub gives back
            ids[up.repo] = getattr(api.create_repo(up.repo, private=private, exist_ok=True), "repo_id", up.repo)
    except Exception as e:  # noqa: BLE001 - no network, a refused token, a name taken: one line, nothing uploaded
        raise UserError(f"cannot push {names}: the hub refused or could not be reached ({first_line(e, 160)}); "
                        "nothing was uploaded") from None  # fmt: skip
    done: list[str] = []
    for up, d, _ in staged:
        try:
            api.upload_folder(repo_id=ids[up.repo], folder_path=d, commit_message=f"lmprefs push: the run's {up.what}")
        except Exception as e:  # noqa: BLE001 - the commit did not land: this repo is as it was
            pushed = f"; {', '.join(done)} pushed already" if done else "; nothing was uploaded"
            raise UserError(f"cannot push {up.repo}: the upload failed ({first_line(e, 160)}){pushed}") from None
        done.append(up.repo)
    return ids
