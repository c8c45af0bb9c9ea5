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
import socket
import tempfile
import time
from pathlib import Path

from lmprefs.errors import UserError

MANIFEST = "manifest.json"
CRASH_ENV = "LMPREFS_CRASH_AT"
_hits: dict[str, int] = {}


class DamagedDirectory(UserError):
    """A published directory whose files do not match its manifest (or that has none)."""


def crash_point(name: str) -> None:
    """Fault injection for the crash tests: with LMPREFS_CRASH_AT=NAME (or NAME@K, the K-th time) the process ends
    here at once with status 9, as after `kill -9`: nothing is cleaned up or flushed."""
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    target, _, nth = spec.partition("@")
    if target != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= int(nth or 1):
        os._exit(9)


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(d: Path) -> None:
    for root, _, files in os.walk(d):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(Path(root))


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
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(out.name + ".tmp-*"):  # left by a killed writer (the run directory is locked)
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() and not stale.is_symlink() else stale.unlink()
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        yield tmp
        files = {f: sha256_file(tmp / f) for f in _files(tmp)}
        (tmp / MANIFEST).write_text(json.dumps({**(meta or {}), "files": files}, indent=1))
        _fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
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
    kept = {version, *([previous] if keep else []), *versions(out)[1 : 1 + keep]}
    for v in versions(out):
        if v not in kept:
            shutil.rmtree(v, ignore_errors=True)
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


def latest_good(out: Path, announce=print) -> tuple[Path, dict] | None:
    """(newest version of `out` that verifies, its manifest), announcing each damaged one passed over and renaming
    it NAME.NNNNNN.damaged; None when there is no version at all. Raises DamagedDirectory when versions exist but
    none verifies. Call it holding the run's lock."""
    out = Path(out)
    candidates = versions(out)
    if not candidates and out.is_dir():  # written before versions existed
        candidates = [out]
    problems, damaged = [], []
    for v in candidates:
        try:
            manifest = verify(v)
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


# --------------------------------------------------------------------------------------------------------------
# The config a checkpoint was trained with

# keys that change how often things are written or how many threads run, never the numbers a run computes
NOT_MATH = ("run.log_interval", "run.save_interval", "run.threads", "run.save_dir", "lora.merged_reward_model")


def flat_config(cfg) -> dict:
    """{"section.key": value} of a Config, as JSON has it (tuples are lists), so it compares with a saved one."""
    from lmprefs.overrides import to_dict

    return json.loads(json.dumps({f"{s}.{k}": v for s, sub in to_dict(cfg).items() for k, v in sub.items()}))


def config_meta(cfg) -> dict:
    """What a checkpoint's manifest records of its config: every value, and a fingerprint of those that change
    the math."""
    flat = flat_config(cfg)
    math_part = {k: v for k, v in flat.items() if k not in NOT_MATH}
    digest = hashlib.sha256(json.dumps(math_part, sort_keys=True).encode()).hexdigest()
    return {"config": flat, "fingerprint": digest}


def math_changes(old: dict, new: dict) -> list[str]:
    """'key old -> new' for each value that changes the math between two flat configs."""
    keys = sorted((set(old) | set(new)) - set(NOT_MATH))
    return [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


# --------------------------------------------------------------------------------------------------------------
# One process per run directory


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """Hold an exclusive flock on RUN_DIR/.lock while the block runs (the kernel drops it when the process dies,
    even by kill -9); a second holder gets one line naming the first: pid, host and start time."""
    import fcntl

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / ".lock"
    f = open(path, "a+")
    try:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            who = f.read().strip() or "another process"
            raise UserError(f"{run_dir} is in use by {who}; wait for it to finish or stop it first") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n")
        f.flush()
        yield
    finally:
        f.close()
