"""Hugging Face `datasets` as a source of rows: a dataset on the hub (`hf:NAME[:SPLIT[:FIELD]]`) or a directory
written by `save_to_disk`, which reads offline. A saved directory is known by the files `save_to_disk` writes
(`dataset_dict.json` for a DatasetDict, `state.json` and `dataset_info.json` for one Dataset), so any path can be
given without a prefix. A DatasetDict needs a split (`DIR:SPLIT`); a single Dataset has none (`DIR`, or `DIR:FIELD`
where a column is asked for).

Every error is a `DatasetReadError` naming the value (`what`: the flag or config key and the spec) and, for a missing
split or column, the ones there are; callers turn it into their own one-line UserError. `datasets` is imported
inside the functions: it pulls in pyarrow and pandas, which only these sources need.
"""

from __future__ import annotations

from pathlib import Path

from lmprefs.errors import first_line

# the column a text is read from when none is named: TRL's and most corpora's `text`, TRL's prompt-only `prompt`,
# TL;DR's `content`
TEXT_COLUMNS = ("text", "prompt", "content")


class DatasetReadError(ValueError):
    """A dataset that cannot be read; the message names the value, where it came from, and what there is."""


def split_spec(spec: str) -> tuple[Path, list[str]]:
    """(path, parts after it) of `PATH[:A[:B]]`; a spec naming an existing path as a whole has no parts (a file
    name with ':' in it stays whole)."""
    whole = Path(spec).expanduser()
    if whole.exists():
        return whole, []
    path, *rest = spec.split(":")
    return Path(path).expanduser(), rest


def is_saved_dataset(path: Path) -> bool:
    """Whether `path` is a directory written by Dataset.save_to_disk or DatasetDict.save_to_disk."""
    one = (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    return path.is_dir() and (_is_dict(path) or one)


def _is_dict(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file()


def saved_parts(path: Path, parts: list[str], what: str, most: int) -> tuple[str | None, list[str]]:
    """(split, the rest) of a saved directory's spec parts: a DatasetDict's first part is its split (required), a
    Dataset has none; at most `most` parts follow the split."""
    if not _is_dict(path):
        if len(parts) > most:
            raise DatasetReadError(f"{what}: a single Dataset (no splits); give at most {most} ':' part(s) after "
                                   f"{path}")  # fmt: skip
        return None, parts
    if not parts or not parts[0]:
        raise DatasetReadError(f"{what}: a DatasetDict with splits {', '.join(_split_names(path))}; name one as "
                               f"{path}:SPLIT")  # fmt: skip
    if len(parts) > most + 1:
        raise DatasetReadError(f"{what}: too many ':' parts after {path} (expected {path}:SPLIT"
                               f"{':FIELD' if most else ''})")  # fmt: skip
    return parts[0], parts[1:]


def _split_names(path: Path) -> list[str]:
    import json

    try:
        return list(json.loads((path / "dataset_dict.json").read_text())["splits"])
    except (OSError, ValueError, KeyError, TypeError):
        return sorted(p.name for p in path.iterdir() if p.is_dir())


def load_saved(path: Path, split: str | None, what: str):
    """The Dataset saved in `path` (the `split` of a DatasetDict; None for a single Dataset)."""
    datasets = _datasets(what)
    if _is_dict(path) and split not in _split_names(path):
        raise DatasetReadError(f"{what}: no split {split!r} in {path} (splits: {', '.join(_split_names(path))})")
    one = path / split if split is not None else path  # a DatasetDict's split is a saved Dataset of its own
    try:
        if _no_shards(one):  # load_from_disk ends in an IndexError on a Dataset saved with no rows
            features = datasets.DatasetInfo.from_directory(str(one)).features or {}
            return datasets.Dataset.from_dict({k: [] for k in features}, features=features or None)
        return datasets.load_from_disk(str(one))
    except (OSError, ValueError, IndexError, KeyError) as e:
        raise DatasetReadError(f"{what}: {one} cannot be read by datasets.load_from_disk "
                               f"({first_line(e)})") from None  # fmt: skip


def _no_shards(path: Path) -> bool:
    """Whether the Dataset saved in `path` has no data files (save_to_disk of a Dataset with no rows)."""
    import json

    try:
        return json.loads((path / "state.json").read_text()).get("_data_files") == []
    except (OSError, ValueError, AttributeError):
        return False


def load_hub(name: str, split: str, what: str):
    """`split` of the hub dataset `name` (or one in the local `datasets` cache); offline or unknown: one line."""
    datasets = _datasets(what)
    try:
        return datasets.load_dataset(name, split=split)
    except Exception as e:  # the hub raises many kinds of errors (offline, gated, no such name or split)
        raise DatasetReadError(f"{what}: cannot load {name!r} split {split!r} from the Hugging Face hub "
                               f"({first_line(e)}); offline, save it with "
                               "Dataset.save_to_disk and give that directory, or use a local "
                               "file") from None  # fmt: skip


def _datasets(what: str):
    """The `datasets` module (a dependency of lmprefs; an environment set up before it was one may lack it)."""
    try:
        import datasets
    except ImportError:
        raise DatasetReadError(f"{what} needs the `datasets` package: pip install 'datasets>=3' (or run "
                               "scripts/setup.sh again)") from None  # fmt: skip
    return datasets


def text_column(columns: list[str], field: str | None, what: str) -> str:
    """The column texts are read from: `field` when given, else the first of TEXT_COLUMNS the dataset has."""
    if field:
        if field not in columns:
            raise DatasetReadError(f"{what}: no column {field!r} (columns: {', '.join(columns)})")
        return field
    for name in TEXT_COLUMNS:
        if name in columns:
            return name
    raise DatasetReadError(f"{what}: no column {', '.join(map(repr, TEXT_COLUMNS))} (columns: {', '.join(columns)})"
                           "; name one after a ':'")  # fmt: skip


def column_texts(ds, field: str | None, what: str) -> list[str]:
    """The texts of one column (text_column's rule); a value that is not a string names its row."""
    column = text_column(list(ds.column_names), field, what)
    texts = ds[column]
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise DatasetReadError(f"{what}: row {i} column {column!r} is {type(t).__name__}, not text")
    return list(texts)


def dataset_rows(ds) -> list[tuple[str, object]]:
    """[("row i", row), ...] of a Dataset: the rows as dicts, named like a JSON list's rows."""
    return [(f"row {i}", row) for i, row in enumerate(ds)]


def saved_rows(path: Path, parts: list[str], what: str) -> list[tuple[str, object]]:
    """The rows of the saved directory `path` (a DatasetDict's split the one part after it), as dataset_rows."""
    split, _ = saved_parts(path, parts, what, most=0)
    return dataset_rows(load_saved(path, split, what))
