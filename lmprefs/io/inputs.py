"""A user's input files and directories, refused in one line that names the flag and the path: one that is missing,
a directory where a file is expected (or a file where a directory is), and text that is not UTF-8; and the output
directories a command will make, refused where a file stands at or above them."""

from __future__ import annotations

import os
from pathlib import Path

from lmprefs.errors import UserError
from lmprefs.io.run_owner import refuse_inside, refuse_other


def path_kind(p: Path, what: str, path: str | Path) -> str:
    """"dir", "file", "other" or "none" for what stands at `p`; a path the system cannot look up (too long, a loop
    of links, a folder it may not enter) is a UserError naming `what`, and a link to nothing is named as one."""
    try:
        if p.is_dir():
            return "dir"
        if p.exists():
            return "file" if p.is_file() else "other"
        if p.is_symlink():
            raise UserError(f"{what} {path}: a link to {os.readlink(p)}, which does not exist")
    except OSError as e:
        raise UserError(f"{what} {str(path)[:100]}: {e.strerror}") from None
    return "none"


def input_file(path: str | Path, what: str) -> Path:
    """`path` as a Path, or a UserError saying that `what` (e.g. "--sft.data") names nothing or a directory."""
    p = Path(path)
    kind = path_kind(p, what, path)
    if kind == "dir":
        raise UserError(f"{what} {path}: is a directory, expected a file")
    if kind == "none":
        raise UserError(f"{what} {path} does not exist")
    return p


def input_dir(path: str | Path, what: str, kind: str = "directory") -> Path:
    """`path` as a Path, or a UserError saying that `what` names nothing or a file (`kind`: what it should be)."""
    p = Path(path)
    found = path_kind(p, what, path)
    if found in ("file", "other"):
        raise UserError(f"{what} {path}: is a file, expected a {kind}")
    if found == "none":
        raise UserError(f"{what} {path} does not exist")
    return p


def read_text(path: str | Path, what: str) -> str:
    """The text of a user's file (UTF-8; a leading byte-order mark is dropped), checked with input_file."""
    p = input_file(path, what)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise UserError(f"{what} {path}: cannot read it ({e.strerror})") from None
    return decode_text(data, f"{what} {path}")


def decode_text(data: bytes, where: str) -> str:
    """`data` decoded as UTF-8, or a UserError naming `where` and the first byte that is not (e.g. a Latin-1 file)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UserError(f"{where}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}, line {line}); "
                        "save it as UTF-8") from None  # fmt: skip
    return text.removeprefix("\ufeff")  # editors on Windows start UTF-8 files with a byte-order mark


def file_in_the_way(path: Path) -> Path | None:
    """The file that keeps a directory from being made at `path`: the path itself, or the nearest existing path
    above it when that is a file (mkdir would end in NotADirectoryError); None where none is."""
    if path.exists():
        return None if path.is_dir() else path
    above = next(d for d in path.parents if d.exists())  # "." or "/" at the latest
    return None if above.is_dir() else above


def output_dir(path: str | Path, what: str, command: str | None = None) -> Path:
    """`path` as a Path for a directory a command makes (or reuses), or a UserError naming `what` (e.g. "--run-dir")
    where a file stands in the way (`file_in_the_way`) or, for `command`, where another command made it
    (run_owner.refuse_other) or it lies inside a run directory (run_owner.refuse_inside), before the model has
    loaded."""
    p = Path(path)
    path_kind(p, what, path)  # a link to nothing ended in FileExistsError where the directory was made
    if (f := file_in_the_way(p)) is not None:
        raise UserError(f"{what} {path}: " + ("is a file" if f == p else f"{f} is a file") + ", not a directory")
    if command is not None:
        refuse_other(p, command, what)
        refuse_inside(p, what)
    return p


LM_DIRS_OF_A_RUN = ("policy", "sft_model")  # where a run keeps the language model it trained


def lm_dir_problem(path: Path) -> str | None:
    """What keeps the directory `path` from being a language model to start from or sample: a run directory (its
    config.json is lmprefs' config of the run, not a model's) or a reward model (lmprefs.json says so, or its
    config.json is a sequence classifier's); None where neither is the case."""
    import json

    def read(name: str) -> dict:
        try:
            d = json.loads((path / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return d if isinstance(d, dict) else {}

    config = read("config.json")
    if "task" in config and "model_type" not in config:
        inside = [path / d for d in LM_DIRS_OF_A_RUN if (path / d).is_dir()]
        return (f"is a run directory, not a model; give the model it trained, {inside[0]}" if inside else
                f"is a run directory, not a model, and holds no {' or '.join(LM_DIRS_OF_A_RUN)}/")  # fmt: skip
    archs = config.get("architectures") or []
    if read("lmprefs.json").get("kind") == "reward_model" or (
            archs and all(str(a).endswith("ForSequenceClassification") for a in archs)):  # fmt: skip
        return "is a reward model (a sequence classifier that scores texts), not a language model that writes them"
    return None


def lm_dir(value: str, what: str) -> None:
    """A UserError naming `what` (e.g. "task.initial_model=") and `value` where `value` is a directory that is not
    a language model (lm_dir_problem); names of assets or hub models, and anything else, pass."""
    p = Path(value).expanduser()
    if p.is_dir() and (problem := lm_dir_problem(p)) is not None:
        raise UserError(f"{what}{value}: {problem}")
