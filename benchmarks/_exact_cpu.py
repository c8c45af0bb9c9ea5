"""The anchor's CpuMonitor with this process's CPU seconds kept unrounded (`own_cpu_s`): its record rounds the cores
used to 0.01, which at a loaded 0.2 cores moves one side's CPU-seconds by up to 2.5% and a ratio of two by up to 5%.

`exact_cpu(common)` patches the anchor's `_anchor_common` in this process (lmprefs' worker); `python _exact_cpu.py
SCRIPT ARGS...` runs the anchor's SCRIPT with it patched (TRL's side, under the anchor venv's python: only the
standard library is imported here).
"""

from __future__ import annotations

import os
import runpy
import sys


def exact_cpu(common) -> None:
    """Make common.CpuMonitor.stop add `own_cpu_s`, the process's user + system seconds since start(), unrounded."""
    cls = common.CpuMonitor
    if getattr(cls, "exact_cpu", False):
        return
    stop = cls.stop

    def exact_stop(self) -> dict:
        t = os.times()
        return {**stop(self), "own_cpu_s": t.user + t.system - self.o0}

    cls.stop, cls.exact_cpu = exact_stop, True


if __name__ == "__main__":
    script = os.path.abspath(sys.argv[1])
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(script))
    import _anchor_common

    exact_cpu(_anchor_common)
    runpy.run_path(script, run_name="__main__")
