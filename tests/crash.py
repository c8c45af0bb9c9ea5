"""Stopping a run at one of lmprefs' crash points (`lmprefs.io.atomic.crash_hook`), where a kill -9 could stop it: the
resume tests stop runs at an exact moment this way rather than after a timed delay."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


class Killed(BaseException):
    """Raised at the crash point: a BaseException, so that no `except Exception` of the code under test stops it."""


def crash_at(point: str, nth: int = 1, error: type[BaseException] = Killed) -> Callable[[str], None]:
    """A crash hook that raises `error(point)` at the nth arrival at `point` (counting from 1)."""
    hits = 0

    def hook(at: str) -> None:
        nonlocal hits
        if at == point:
            hits += 1
            if hits == nth:
                raise error(at)

    return hook


def killed(monkeypatch, args: list[str], point: str, nth: int = 1) -> None:
    """`lmprefs ARGS` run in this process and stopped by Killed at the nth arrival at `point`; the hook is off
    again afterwards."""
    from lmprefs.cli.dispatch import main
    from lmprefs.io import atomic

    monkeypatch.setattr(atomic, "crash_hook", crash_at(point, nth))
    with pytest.raises(Killed):
        main(args)
    monkeypatch.setattr(atomic, "crash_hook", None)
    # TensorBoard reads a log directory's event files in name order, events.out.tfevents.<second>.<host>.<pid>.<n>:
    # the resumed run's writer in this same process may fall in the same second with a count that sorts first (10
    # before 9), and its purge would then not cover the killed attempt's events. A new process starts seconds later.
    time.sleep(1.01 - time.time() % 1.0)
