"""A user's own prompt files as lists of texts: `.txt` (paragraphs split on blank lines), `.jsonl` and `.json` (rows
that are strings, or objects read by a field), `.csv` (a header row, then one prompt per row, read by a column).

One rule picks the field of object rows and the column of a CSV file: the one named after the path
(`prompts.csv:COLUMN`, `prompts.jsonl:FIELD`), else the first of `text`, `prompt`, `content` that the first object
or the header has (`hf_datasets.TEXT_COLUMNS`, the rule for datasets too). A `.json` file read by `content` is the
original's TL;DR format and is cleaned as the original cleans its posts (`summarize.clean_tldr`). Every error is a
QueryDataError-style UserError naming the file, the line or row, and the field.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from lmprefs.assets.corpora import paragraphs
from lmprefs.data.hf_datasets import TEXT_COLUMNS
from lmprefs.data.summarize import clean_tldr
from lmprefs.errors import UserError
from lmprefs.io.inputs import read_text
from lmprefs.io.jsonl import JsonRowsError, json_rows

SUFFIXES = (".txt", ".jsonl", ".json", ".csv")


def prompt_file_texts(path: Path, field: str | None, what: str, error: type[UserError]) -> list[str]:
    """The texts of a prompt file by its suffix (any suffix but .jsonl/.json/.csv is plain text); `error` is the
    caller's UserError subclass."""
    if path.suffix == ".csv":
        return csv_texts(path, field, what, error)
    if path.suffix in (".jsonl", ".json"):
        return json_texts(path, field, error)
    if field:
        raise error(f"{what}: a plain text file has no fields (':{field}'); fields are for .jsonl, .json and .csv")
    return paragraphs(read_text(path, what))


def _default_field(names, where: str, error: type[UserError]) -> str:
    for name in TEXT_COLUMNS:
        if name in names:
            return name
    raise error(f"{where}: no field {', '.join(map(repr, TEXT_COLUMNS))} (has: {', '.join(map(str, names))}); name "
                "one as FILE:FIELD")  # fmt: skip


def json_texts(path: Path, field: str | None, error: type[UserError]) -> list[str]:
    """Texts of a JSON list or JSONL file whose rows are strings, or objects read by `field` (or the default)."""
    try:
        _, rows = json_rows(path)  # [(where, row)], where = "row 3" (JSON list) or "line 4" (JSONL)
    except JsonRowsError as e:
        raise error(str(e)) from None
    objects = [(where, row) for where, row in rows if isinstance(row, dict)]
    if objects and not field:
        field = _default_field(list(objects[0][1]), f"{path.name} {objects[0][0]}", error)
    texts = []
    for where, row in rows:
        if isinstance(row, dict):
            if field not in row:
                raise error(f"{path.name} {where}: missing field {field!r}")
            row = row[field]
        elif not isinstance(row, str):
            raise error(f"{path.name} {where}: expected a string or an object, got {type(row).__name__}")
        if not isinstance(row, str):
            raise error(f"{path.name} {where}: field {field!r} is {type(row).__name__}, not a string")
        texts.append(row)
    if path.suffix == ".json" and field == "content":  # the original's TL;DR posts
        texts = [clean_tldr(t) for t in texts]
    return texts


def csv_texts(path: Path, column: str | None, what: str, error: type[UserError]) -> list[str]:
    """Texts of one column of a CSV file with a header row (Python's csv dialect: ',' and '"' quoting, so a cell
    may hold commas and newlines)."""
    reader = csv.reader(io.StringIO(read_text(path, what), newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise error(f"{path.name}: empty CSV file (expected a header row naming its columns)")
        column = column or _default_field(header, f"{path.name} header", error)
        if column not in header:
            raise error(f"{path.name}: no column {column!r} (columns: {', '.join(header)})")
        k = header.index(column)
        texts = []
        for row in reader:
            if not row:
                continue
            if len(row) != len(header):
                raise error(f"{path.name} line {reader.line_num}: {len(row)} cells, the header has {len(header)}")
            texts.append(row[k])
    except csv.Error as e:
        raise error(f"{path.name} line {reader.line_num}: not CSV ({e})") from None
    return texts
