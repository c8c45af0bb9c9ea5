"""reward_accuracy.py's instrumentation of lmprefs' reward-model pipeline: the seconds spent in train_epoch,
normalize, evaluate and label_prefixes, the training and held-out sets that reach them, and the cores this process
and the others used during train_epoch."""

from __future__ import annotations

import os
import time
from types import ModuleType

from _common import busy_cpu_seconds

TIMED = ("train_epoch", "normalize", "evaluate", "label_prefixes")


class RewardModelTimers:
    """Replaces TIMED in `module` (lmprefs.pipeline.reward_model, through whose namespace train_reward_model calls
    them) by timed wrappers, for the rest of the process. `timers` sums each one's seconds and `captured` keeps the
    last training set ("train"), held-out set ("held") and train_epoch's CpuMonitor reading ("cpu"); `clear` starts
    them again for the next reward model."""

    def __init__(self, module: ModuleType):
        self.timers: dict[str, float] = {}
        self.captured: dict = {}
        self._orig = {k: getattr(module, k) for k in TIMED}
        # label_prefixes: the frozen blocks, run once before the epochs (LoRA only)
        wrapped = {"train_epoch": self._train_epoch, "normalize": self._wrap("normalize"), "evaluate": self._evaluate,
                   "label_prefixes": self._wrap("label_prefixes")}  # fmt: skip
        for name, fn in wrapped.items():
            setattr(module, name, fn)

    def clear(self) -> None:
        self.timers.clear()
        self.captured.clear()

    def _wrap(self, name: str):
        def f(*a, **k):
            s = time.perf_counter()
            try:
                return self._orig[name](*a, **k)
            finally:
                self.timers[name] = self.timers.get(name, 0.0) + time.perf_counter() - s

        return f

    def _train_epoch(self, rm, data, *a, **k):
        self.captured["train"] = data
        mon = CpuMonitor()
        try:
            return self._wrap("train_epoch")(rm, data, *a, **k)
        finally:
            self.captured["cpu"] = mon.stop()

    def _evaluate(self, rm, data, *a, **k):
        self.captured["held"] = data
        return self._wrap("evaluate")(rm, data, *a, **k)


class CpuMonitor:
    """Cores used by this process and by everything else over a region (/proc/stat), as the anchor's CpuMonitor."""

    def __init__(self):
        self.t0, self.b0, self.o0 = time.perf_counter(), busy_cpu_seconds(), self._own()

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system

    def stop(self) -> dict:
        wall = time.perf_counter() - self.t0
        own = self._own() - self.o0
        return {
            "wall_s": round(wall, 2),
            "own_cores_avg": round(own / wall, 2),
            "other_cores_avg": round(max(busy_cpu_seconds() - self.b0 - own, 0.0) / wall, 2),
        }
