"""Crash-safe directories and run-directory locking.

A published directory (`checkpoint/`, `policy/`, `reward_model/`) is a symlink to a versioned sibling
(`checkpoint.000007/`). A new version is written into `NAME.tmp-*`, gets a manifest (sha256 of every file plus
what the caller records) written last, is fsynced file by file, renamed to its version name, and only then is the
symlink replaced (os.replace of a new link: atomic), so at every instant `NAME/` is a complete directory, old or new.
A `kill -9` at any point leaves at worst a stale `NAME.tmp-*` (removed by the next write) or a complete version the
link does not point to yet. Loaders verify the manifest and fall back to the newest older version that verifies.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from lmprefs.errors import UserError
from lmprefs.io.atomic import as_created, crash_point, fsync_dir, storage_error, writing

MANIFEST = "manifest.json"


class DamagedDirectory(UserError):
    """A published directory whose files do not match its manifest (or that has none)."""


def _fsync_tree(d: Path) -> None:
    for root, _, files in os.walk(d):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(Path(root))


def _refused_write(d: Path) -> str | None:
    """Whether `d`'s filesystem refuses writes now (storage_error's reason, or None), by writing a MiB to it and
    syncing. torch.save to a path reports a full disk as "unexpected pos N vs M" without the OSError behind it."""
    try:
        with open(d / ".write-probe", "wb") as f:
            f.write(bytes(1 << 20))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        return storage_error(e)
    return None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and p.name != MANIFEST)


def versions(out: Path) -> list[Path]:
    """The complete versions of a published directory, newest first."""
    out = Path(out)
    pat = re.compile(re.escape(out.name) + r"\.(\d{6})$")
    found = [(int(m.group(1)), p) for p in out.parent.glob(out.name + ".*") if (m := pat.match(p.name))]
    return [p for _, p in sorted(found, reverse=True) if p.is_dir()]


@contextlib.contextmanager
def publish_dir(out: Path, meta: dict | None = None, keep: int = 0):
    """Yield an empty temporary directory to write into; on success it becomes `out` (see the module docstring).
    `meta` goes into the manifest; `keep` older versions stay on disk for fallback."""
    out = Path(out)
    kept = f"; the previous {out.name} is kept" if out.exists() else f"; no {out.name} was written"
    with writing(out, kept):
        out.parent.mkdir(parents=True, exist_ok=True)
        for stale in out.parent.glob(out.name + ".tmp-*"):  # left by a killed writer (the run directory is locked)
            shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() and not stale.is_symlink() else stale.unlink()
        tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        yield tmp
        files = {f: sha256_file(tmp / f) for f in _files(tmp)}
        (tmp / MANIFEST).write_text(json.dumps({**(meta or {}), "files": files}, indent=1))
        as_created(tmp)  # a teammate reads a shared run: not mkdtemp's 0700 nor safetensors' 0600
        _fsync_tree(tmp)
    except BaseException as e:
        reason = storage_error(e) or (_refused_write(tmp) if isinstance(e, RuntimeError) else None)
        shutil.rmtree(tmp, ignore_errors=True)
        if reason is None:
            raise
        raise UserError(f"cannot write {out}: {reason}{kept}") from None
    crash_point(f"publish:{out.name}:written")
    old = versions(out)
    version = out.parent / f"{out.name}.{(int(old[0].name[-6:]) + 1) if old else 1:06d}"
    os.replace(tmp, version)
    fsync_dir(out.parent)
    crash_point(f"publish:{out.name}:renamed")
    previous = out.parent / os.readlink(out) if out.is_symlink() else None
    if out.exists() and not out.is_symlink():  # a plain directory from an older lmprefs: retire it first
        shutil.rmtree(out.parent / f"{out.name}.legacy", ignore_errors=True)
        os.replace(out, out.parent / f"{out.name}.legacy")
    link = out.parent / f"{out.name}.tmp-link-{os.getpid()}"
    os.symlink(version.name, link)
    os.replace(link, out)
    fsync_dir(out.parent)
    crash_point(f"publish:{out.name}:switched")
    survivors = {version, *([previous] if keep else []), *versions(out)[1 : 1 + keep]}
    for v in versions(out):
        if v not in survivors:
            shutil.rmtree(v, ignore_errors=True)
    shutil.rmtree(out.parent / f"{out.name}.legacy", ignore_errors=True)


def remove(out: Path) -> None:
    """A published directory deleted: its link first (a kill then leaves only versions no name points to), then every
    version and a retired plain directory. A plain directory (an older lmprefs) is deleted as it is."""
    out = Path(out)
    if out.is_symlink():
        out.unlink()
    elif out.exists():
        shutil.rmtree(out)
    for v in versions(out):
        shutil.rmtree(v)
    shutil.rmtree(out.parent / f"{out.name}.legacy", ignore_errors=True)


def verify(d: Path) -> dict:
    """The manifest of a published directory version, after checking every file's sha256; DamagedDirectory names
    the first problem."""
    d = Path(d)
    try:
        manifest = json.loads((d / MANIFEST).read_text())
        files = manifest["files"]
    except FileNotFoundError:
        raise DamagedDirectory(f"{d}: no {MANIFEST} (incomplete, or written by an older lmprefs)") from None
    except (ValueError, KeyError, TypeError):
        raise DamagedDirectory(f"{d}/{MANIFEST} is damaged") from None
    for name, digest in files.items():
        p = d / name
        if not p.is_file():
            raise DamagedDirectory(f"{d}: {name} is missing")
        if sha256_file(p) != digest:
            raise DamagedDirectory(f"{d}: {name} does not match its sha256 in {MANIFEST} (damaged or replaced)")
    extra = sorted(set(_files(d)) - set(files))
    if extra:
        raise DamagedDirectory(f"{d}: {extra[0]} is not in {MANIFEST}")
    return manifest


def latest_good(out: Path, announce=print, check: Callable[[Path, dict], None] | None = None
                ) -> tuple[Path, dict] | None:  # fmt: skip
    """(newest version of `out` that verifies, its manifest), announcing each damaged one passed over and renaming
    it NAME.NNNNNN.damaged; None when there is no version at all. Raises DamagedDirectory when versions exist but
    none verifies. `check(version, manifest)` may raise DamagedDirectory for what the manifest cannot see (files
    whose contents disagree with each other). Call it holding the run's lock."""
    out = Path(out)
    candidates = versions(out)
    if not candidates and out.is_dir():  # written before versions existed
        candidates = [out]
    problems, damaged = [], []
    for v in candidates:
        try:
            manifest = verify(v)
            if check is not None:
                check(v, manifest)
        except DamagedDirectory as e:
            problems.append(str(e))
            damaged.append(v)
            continue
        for p, bad in zip(problems, damaged, strict=True):  # set aside, so that pruning keeps the good ones
            os.replace(bad, bad.with_name(bad.name + ".damaged"))
            announce(f"passing over a damaged version: {p}; using {v.name} (the damaged one is now "
                     f"{bad.name}.damaged)")  # fmt: skip
        return v, manifest
    if problems:
        raise DamagedDirectory(f"no usable {out.name}: {problems[0]}" + (f" (and {len(problems) - 1} more)"
                                                                        if len(problems) > 1 else ""))  # fmt: skip
    return None
