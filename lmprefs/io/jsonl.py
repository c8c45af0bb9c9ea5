"""JSON and JSONL rows: the reader that names the line of a bad row, the plain reader of the run's own logs, and
the truncation that makes a resumed run's log hold each step once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmprefs.errors import UserError
from lmprefs.io.atomic import atomic_write_text
from lmprefs.io.inputs import decode_text


class JsonRowsError(ValueError):
    """A JSON or JSONL file that cannot be read; the message names the file and the line."""


def json_rows(path: Path) -> tuple[str, list[tuple[str, object]]]:
    """("json" | "jsonl", [(where, row), ...]) of a JSON list or a JSONL file, where `where` is "row 17" or
    "line 18"."""
    if Path(path).is_dir():
        raise JsonRowsError(f"{path}: is a directory, expected a file")
    try:
        text = decode_text(Path(path).read_bytes(), path.name)
    except OSError as e:
        raise JsonRowsError(f"{path.name}: cannot read: {e}") from e
    except UserError as e:
        raise JsonRowsError(str(e)) from None
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise JsonRowsError(f"{path.name}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from e
        except RecursionError:
            raise JsonRowsError(f"{path.name}: JSON nested too deeply to read") from None
        return "json", [(f"row {i}", row) for i, row in enumerate(data)]
    return "jsonl", [(f"line {n}", row) for n, row in jsonl_lines(text, path.name)]


def jsonl_lines(text: str, where: str) -> list[tuple[int, Any]]:
    """[(line number, row), ...] of JSONL text, blank lines skipped; a line that is not JSON raises JsonRowsError
    naming `where` (the file, or the flag and the file) and the line."""
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append((n, json.loads(line)))
            except json.JSONDecodeError as e:
                raise JsonRowsError(f"{where} line {n}: invalid JSON at column {e.colno}: {e.msg}") from e
            except RecursionError:
                raise JsonRowsError(f"{where} line {n}: JSON nested too deeply to read") from None
    return rows


def truncate_jsonl(path: Path, last_step: int, key: str = "step", phase: str | None = None) -> None:
    """Drop the rows whose `key` is past last_step (only rows of `phase`, when given: reward rows count labels, not
    updates), by writing a new file and swapping it in (a kill meanwhile leaves the old file whole). A torn last
    line (killed mid-append) is dropped too."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            if (phase is not None and row.get("phase", phase) != phase) or row[key] <= last_step:
                keep.append(line)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    atomic_write_text(path, "".join(line + "\n" for line in keep))


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSONL file this package wrote (metrics.jsonl, samples.jsonl, the assets' passages)."""
    return [row for _, row in jsonl_lines(Path(path).read_text(encoding="utf-8"), str(path))]
