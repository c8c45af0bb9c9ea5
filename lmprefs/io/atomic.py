"""The one atomic text writer, and the fault injection that the crash tests use to stop a run at an exact point.

A file written with `atomic_write_text` is either its old content or its new content at every instant: the new text
goes to a temporary sibling, is fsynced, and replaces the file with os.replace.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from lmprefs.errors import UserError

CRASH_ENV = "LMPREFS_CRASH_AT"
_hits: dict[str, int] = {}
# In-process tests set this to stop a run by an exception at a crash point instead of ending the process.
crash_hook: Callable[[str], None] | None = None


def crash_point(name: str) -> None:
    """Fault injection for the crash tests: with LMPREFS_CRASH_AT=NAME (or NAME@K, the K-th time) the process ends
    here at once with status 9, as after `kill -9`: nothing is cleaned up or flushed."""
    if crash_hook is not None:
        crash_hook(name)
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


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    with writing(path, "; the file is as it was"):
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(path)
        fd, tmp = tempfile.mkstemp(prefix=f"{path.name}.tmp-{os.getpid()}-", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            as_created(Path(tmp))
            crash_point(f"atomic-write:{path.name}")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def current_umask() -> int:
    """This process's umask, read where Linux shows it (/proc/self/status); elsewhere set and put back."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def as_created(path: Path) -> None:
    """Give `path` (a file, or a directory and everything in it) the modes open() and mkdir() would have given it:
    0o666 for a file (0o777 if its owner may run it) and 0o777 for a folder, less the umask. Temporary files and
    folders (mkstemp, mkdtemp) are made 0600 and 0700, and safetensors writes its files 0600, so what was written
    through them and renamed into place was unreadable to a teammate sharing a run."""
    mask = current_umask()
    for p in [path, *(path.rglob("*") if path.is_dir() and not path.is_symlink() else [])]:
        if p.is_symlink():
            continue
        mode = p.stat().st_mode
        full = 0o777 if p.is_dir() or mode & 0o100 else 0o666
        os.chmod(p, full & ~mask)


# A write refused by its destination: the disk or the quota is full, the filesystem is read-only, or the directory
# is not ours. The user can fix these; they are not bugs, so they end a command in one line, not a traceback.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES})


def storage_error(e: BaseException | None) -> str | None:
    """Why a write failed when its destination refused it (STORAGE_ERRNOS), found in `e` or in the exceptions it was
    raised from or during: an OSError, or an error whose text carries the code as Rust reports it (safetensors:
    "I/O error: No space left on device (os error 28)"); None for any other error."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
            return os.strerror(e.errno)
        m = re.search(r"\(os error (\d+)\)", str(e))
        if m and int(m.group(1)) in STORAGE_ERRNOS:
            return os.strerror(int(m.group(1)))
        e = e.__cause__ or e.__context__
    return None


@contextlib.contextmanager
def writing(path: Path, outcome: str = ""):
    """Writes to `path` inside this block that its destination refuses (storage_error) become one UserError naming
    the path and the reason, followed by `outcome` (what was kept)."""
    try:
        yield
    except Exception as e:
        reason = storage_error(e)
        if reason is None:
            raise
        raise UserError(f"cannot write {path}: {reason}{outcome}") from None


def _remove_stale_temporaries(path: Path) -> None:
    """Delete the temporary siblings of `path` whose writer was killed before its rename (NAME.tmp-PID-XXXXXXXX with
    no process PID); a live writer's are left alone."""
    for f in path.parent.glob(f"{glob.escape(path.name)}.tmp-*"):
        pid = f.name[len(path.name) + len(".tmp-"):].partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            f.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
