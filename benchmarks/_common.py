"""Pieces the benchmark scripts share (they run as `python benchmarks/NAME.py`, so this folder is on sys.path)."""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import sys
import time
from pathlib import Path

# The benchmarks run offline (models are lmprefs assets or local directories): a name that is neither fails at once
# instead of retrying the hub for half a minute. Set before the scripts import transformers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are one line on stderr and exit 2, like lmprefs' own commands (argparse itself prints
    the usage block first)."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def source_fingerprint() -> dict:
    """sha1 of lmprefs' Python sources (and their newest mtime): which code a run measured, without git."""
    import lmprefs

    root = Path(lmprefs.__file__).parent
    h, newest = hashlib.sha1(), 0.0
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
        newest = max(newest, f.stat().st_mtime)
    return {"sha1": h.hexdigest()[:12], "newest_mtime": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(newest))}


def int_at_least(lo: int):
    """An argparse type: an integer >= lo, so that a bad value is a one-line error and exit 2."""

    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {s!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo}, not {v}")
        return v

    parse.__name__ = f"int >= {lo}"
    return parse


positive_int, nonnegative_int = int_at_least(1), int_at_least(0)


def run_main(main) -> int:
    """main()'s exit code, with lmprefs' UserError (a bad value found past the flags: a missing asset, no CUDA) as
    one line and exit 2, as lmprefs' own commands do, instead of a traceback."""
    from lmprefs.errors import UserError

    try:
        return main()
    except UserError as e:
        print(f"{Path(sys.argv[0]).name}: error: {e}", file=sys.stderr)
        return 2


def busy_cpu_seconds() -> float:
    """CPU seconds every process on the machine has been busy since boot (/proc/stat, idle and iowait left out):
    its difference over a region, less this process's own, is what other work took."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def cpu_name() -> str:
    """The CPU's model name, as `lscpu` shows it (every figure names its machine)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
