"""Which command a run directory belongs to: each command that makes one records itself in RUN_DIR/command.json
when it first writes there (`claim`), and every command that writes into a directory refuses one another command
made (`refuse_other`), in one line, before it writes anything. Directories written before the record existed are
told by what they hold (`inferred_owner`)."""

from __future__ import annotations

import json
from pathlib import Path

from lmprefs.errors import UserError

MARKER = "command.json"  # {"command": "train-dpo"}; experiments record their name too ("experiment compare")


def owner(run_dir: Path) -> str | None:
    """The command that made run_dir: its record, else what its files say (inferred_owner); None for a directory
    that does not exist, is empty, or holds nothing a command of lmprefs leaves."""
    path = Path(run_dir) / MARKER
    if not path.is_file():
        return inferred_owner(Path(run_dir))
    try:
        command = json.loads(path.read_text(encoding="utf-8"))["command"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{path}: not the record of the command that made {run_dir} (a JSON object with "
                        "\"command\"); restore it, or choose another directory") from None  # fmt: skip
    if not isinstance(command, str):
        raise UserError(f"{path}: \"command\" is not a command name")
    return command


def _same(made_by: str, command: str) -> bool:
    # an experiment whose name could not be told from its files is taken to be the one resuming it
    return made_by == command or (made_by == "experiment" and command.startswith("experiment "))


def refuse_other(run_dir: Path, command: str, what: str) -> None:
    """A UserError naming run_dir (given by the flag `what`) and its command, where a command other than `command`
    made it: writing into it would mix two commands' files (and label stores, logs, reports)."""
    made_by = owner(run_dir)
    if made_by is not None and not _same(made_by, command):
        raise UserError(f"{what} {run_dir}: holds a run of `lmprefs {made_by}`, and `lmprefs {command}` writes only "
                        f"into a directory of its own; continue that run with `lmprefs {made_by}`, or choose another "
                        f"{what}")  # fmt: skip


ARTIFACTS = ("policy", "sft_model", "reward_model", "checkpoint", "logs")  # the folders a run keeps its work in


def refuse_inside(path: Path, what: str) -> None:
    """A UserError naming path (given by the flag `what`) where it lies inside a run directory: one that records its
    command, or one whose files tell it (inferred_owner) where path goes into one of its ARTIFACTS: a command
    writing there would mix its files into another run's."""
    given = Path(path).absolute()
    for above, below in zip(given.parents, [given, *given.parents], strict=False):
        if (above / MARKER).is_file() or (below.name in ARTIFACTS and inferred_owner(above) is not None):
            raise UserError(f"{what} {path}: inside {above}, a run directory of `lmprefs {owner(above)}`; choose "
                            f"a {what} outside it")  # fmt: skip


def claim(run_dir: Path, command: str, what: str = "--run-dir", argv: list[str] | None = None) -> None:
    """Make run_dir (and its parents) for `command` and record it there (atomically, once), after refusing a
    directory another command made; `argv`: the command line that made it, recorded beside the command (for a
    command that continues only its own command line, `recorded_argv`). Called where a command first writes into
    its directory."""
    from lmprefs.io.atomic import atomic_write_text

    run_dir = Path(run_dir)
    refuse_other(run_dir, command, what)
    if not (run_dir / MARKER).is_file():
        run_dir.mkdir(parents=True, exist_ok=True)
        record = {"command": command} | ({"argv": argv} if argv is not None else {})
        atomic_write_text(run_dir / MARKER, json.dumps(record) + "\n")


def recorded_argv(run_dir: Path) -> list[str] | None:
    """The command line recorded in run_dir's command.json by `claim`; None where none was (or no record is)."""
    argv = _json(Path(run_dir) / MARKER).get("argv")
    return [str(a) for a in argv] if isinstance(argv, list) else None


# experiment-args.json keys that only one experiment saves
_EXPERIMENT_KEYS = (("demo_prompts", "writing-prompts"), ("dpo_betas", "compare"), ("betas", "kl-frontier"),
                    ("labels", "mock-sentiment"))  # fmt: skip


def inferred_owner(run_dir: Path) -> str | None:
    """The command whose files run_dir holds, for a directory written before commands recorded themselves (None
    where nothing tells): experiment-config.json an experiment (its name from experiment-args.json), results.json
    with a reference's figures an evaluation, run.json train-policy (its reward) or train-dpo (its store),
    sft_model/ train-sft, a config.json beside labels.sqlite a quickstart, metrics.jsonl's first phase sft or dpo
    runs, and a reward_model/ with a config.json train-reward."""
    if not run_dir.is_dir():
        return None
    names = {p.name for p in run_dir.iterdir()}
    if names & {"experiment-config.json", "experiment-args.json"}:
        args = _json(run_dir / "experiment-args.json")
        return next((f"experiment {name}" for key, name in _EXPERIMENT_KEYS if key in args), "experiment")
    if "reference_eval" in _json(run_dir / "results.json"):
        return "evaluate"
    if "run.json" in names:
        meta = _json(run_dir / "run.json")
        return "train-policy" if {"reward", "online"} & set(meta) else "train-dpo" if "store" in meta else None
    if "sft_model" in names:
        return "train-sft"
    if {"config.json", "labels.sqlite"} <= names:
        return "quickstart"
    phase = _first_phase(run_dir / "metrics.jsonl")
    if phase in ("sft", "dpo"):
        return f"train-{phase}"
    if {"config.json", "reward_model"} <= names:
        return "train-reward"
    return None


def _json(path: Path) -> dict:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def _first_phase(path: Path) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            row = json.loads(f.readline())
    except (OSError, ValueError):
        return None
    return row.get("phase") if isinstance(row, dict) else None
