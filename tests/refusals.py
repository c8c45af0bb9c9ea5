"""A bad command line as the CLI must meet it: exit code 2, exactly one line on stderr naming the value, no
traceback, and nothing written. Runs in-process through `lmprefs.cli.main`; shared by the bad-input tables."""

from __future__ import annotations

import os
import re
from pathlib import Path

from lmprefs.cli.dispatch import main

BAR = re.compile(r"\d+%\|")  # a progress bar a command had drawn before it failed mid-way: no message


def tree(root: Path) -> dict[str, int]:
    """Every path under root with its modification time: equal before and after, nothing was written."""
    return {str(p.relative_to(root)): p.lstat().st_mtime_ns for p in root.rglob("*")}


def assert_refused(argv: list[str], needle: str, root: Path, capsys) -> str:
    """Run argv in the current directory, `root` (chdir there first); its one line (beside any progress bar),
    after checking it is one, starts with `lmprefs CMD`, contains `needle`, and that nothing under root changed."""
    before = tree(root)
    try:
        code = main(argv)
    except SystemExit as e:  # must not happen: argparse errors are UserErrors too
        code = f"SystemExit({e.code})"
    out, err = capsys.readouterr()
    lines = [x for x in err.strip().splitlines() if not BAR.search(x)]
    assert code == 2, f"exit {code}; stderr: {err}"
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"lmprefs {argv[0]}"), lines[0]
    assert needle in lines[0], lines[0]
    assert tree(root) == before, "a failed command wrote or changed files"
    assert not os.path.exists(root / "runs")
    return lines[0]
