"""A pytest plugin, off by default, that records each test's CPU-seconds (user+sys of the test process and of the
children it waited for) for its set-up, call and tear-down: wall time says little on a shared or loaded machine.

    PYTHONPATH=$PWD:$PWD/tests python -m pytest -p cputime --cputime-out=cpu.jsonl -n 0 tests/training

Each line of the output is {"test": nodeid, "phase": "setup"|"call"|"teardown", "cpu_s": ..., "end": unix time,
"worker": xdist's worker id or "main"}; a session-scoped fixture's cost lands on the set-up of the first test that
uses it. Under xdist (-n 2) each worker appends its own lines. `python tests/cputime.py cpu.jsonl` sums them per
test and per module, costliest first."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from lmprefs.io.jsonl import read_jsonl


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_addoption(parser):
    parser.addoption("--cputime-out", default="cputime.jsonl", help="JSONL file the per-test CPU-seconds go to")


def _record(item, phase: str, start: float) -> None:
    row = {"test": item.nodeid, "phase": phase, "cpu_s": round(_cpu_seconds() - start, 3),
           "end": round(time.time(), 3), "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}  # fmt: skip
    with open(item.config.getoption("--cputime-out"), "a", encoding="utf-8") as out:
        out.write(json.dumps(row) + "\n")


def _timed(item, phase: str):
    start = _cpu_seconds()
    try:
        return (yield)
    finally:
        _record(item, phase, start)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _timed(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _timed(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    return (yield from _timed(item, "teardown"))


def summarise(path: str, top: int = 40) -> None:
    per_test: dict[str, float] = defaultdict(float)
    per_module: dict[str, float] = defaultdict(float)
    ends: dict[str, float] = defaultdict(float)
    for row in read_jsonl(Path(path)):
        per_test[row["test"]] += row["cpu_s"]
        per_module[row["test"].split("::")[0]] += row["cpu_s"]
        worker = row.get("worker", "main")
        ends[worker] = max(ends[worker], row.get("end", 0.0))
    print(f"{len(per_test)} tests, {sum(per_test.values()):.1f} CPU-s")
    if len(ends) > 1:  # how long the first worker to finish waited for the last
        print("workers' last test ended " + ", ".join(f"{w} {max(ends.values()) - t:.1f} s" for w, t in
                                                       sorted(ends.items())) + " before the last")  # fmt: skip
    for name, seconds in sorted(per_module.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{seconds:8.1f}  {name}")
    print()
    for name, seconds in sorted(per_test.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{seconds:8.1f}  {name}")


if __name__ == "__main__":
    summarise(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40)
