"""`lmprefs COMMAND ...`: the command line. Each command imports its heavy modules only when it runs.

Config overrides are dotted flags (`--ppo.lr 2e-5`) applied to a preset; a command's own flags are plain
(`--n 4`). A user's mistake (UserError) prints one line and exits 2; nothing else is caught.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from typing import NoReturn

from lmprefs.cli.assets import cmd_assets
from lmprefs.cli.common import COMMANDS
from lmprefs.cli.config import cmd_config, cmd_presets
from lmprefs.cli.evaluate import cmd_evaluate
from lmprefs.cli.experiment import cmd_experiment
from lmprefs.cli.labels import cmd_export_labels, cmd_import_labels, cmd_label, cmd_rank_queue
from lmprefs.cli.push import cmd_push
from lmprefs.cli.quickstart import cmd_quickstart
from lmprefs.cli.sample import cmd_sample
from lmprefs.cli.score import cmd_score
from lmprefs.cli.serve import cmd_labelers, cmd_serve
from lmprefs.cli.train import cmd_train_dpo, cmd_train_policy, cmd_train_reward, cmd_train_sft
from lmprefs.errors import UserError
from lmprefs.io.atomic import STORAGE_ERRNOS

HANDLERS = {"config": cmd_config, "experiment": cmd_experiment, "quickstart": cmd_quickstart, "serve": cmd_serve,
            "labelers": cmd_labelers, "train-policy": cmd_train_policy, "assets": cmd_assets, "sample": cmd_sample,
            "presets": cmd_presets, "label": cmd_label, "import-labels": cmd_import_labels,
            "export-labels": cmd_export_labels, "train-reward": cmd_train_reward, "score": cmd_score,
            "train-sft": cmd_train_sft, "train-dpo": cmd_train_dpo, "evaluate": cmd_evaluate,
            "push": cmd_push, "rank-queue": cmd_rank_queue}  # fmt: skip


# commands that run as N ranks under torchrun/accelerate; the others are single-process tools
DISTRIBUTED = {"label", "train-reward", "train-policy", "quickstart"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--version", "-V"):
        from lmprefs import __version__

        print(f"lmprefs {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("usage: lmprefs [--version] COMMAND [ARGS]   (lmprefs COMMAND --help for each)\n\ncommands:")
        for name, desc in COMMANDS.items():
            print(f"  {name:14s} {desc}")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in HANDLERS:
        import difflib

        near = difflib.get_close_matches(cmd, list(HANDLERS), n=1)
        print(f"lmprefs: error: unknown command {cmd!r}" + (f"; did you mean {near[0]!r}?" if near else ""),
              file=sys.stderr)  # fmt: skip
        return 2
    # under a launcher (torchrun sets RANK and WORLD_SIZE) join the process group; without one, torch is not even
    # imported here and nothing changes
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    return _run(cmd, rest, launched)


def entry() -> NoReturn:
    """The process's entry point (the `lmprefs` script, `python -m lmprefs`): main's status as the exit status."""
    rc = main()
    if "lmprefs.runtime.distributed" in sys.modules and "RANK" in os.environ:
        _end_rank(rc)
    sys.exit(rc)


def _run(cmd: str, rest: list[str], launched: bool) -> int:
    """The command's exit status; a user's mistake, a full disk or a lost rank as one line on stderr."""
    where = f" (rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')})" if launched else ""
    try:
        if launched and cmd not in DISTRIBUTED and os.environ["WORLD_SIZE"] != "1":
            raise UserError(f"runs in one process; launch it without torchrun/accelerate (WORLD_SIZE="
                            f"{os.environ['WORLD_SIZE']}); these run on several: {', '.join(sorted(DISTRIBUTED))}")
        if launched and cmd in DISTRIBUTED:
            from lmprefs.runtime import distributed

            distributed.init()
        return HANDLERS[cmd](rest) or 0
    except UserError as e:
        _close_progress()
        print(f"lmprefs {cmd}: error{where}: {e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print(f"lmprefs {cmd}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `lmprefs presets x | head`: the reader left; nothing to report
        sys.stderr.close()
        return 0
    except OSError as e:  # a full disk, a read-only or someone else's directory: the user's to fix, not a bug
        if e.errno not in STORAGE_ERRNOS | {errno.ENAMETOOLONG}:  # and a path past the file system's limit
            raise
        _close_progress()
        print(f"lmprefs {cmd}: error{where}: {e.strerror}" + (f": {e.filename}" if e.filename else ""),
              file=sys.stderr, flush=True)  # fmt: skip
        return 2
    except Exception as e:
        if not (launched and _is_dist_error(e)):
            raise
        # another rank died or stopped answering within LMPREFS_DIST_TIMEOUT: say which rank this is, in one line
        first = (str(e).strip().splitlines() or [""])[0][:300]
        print(f"lmprefs {cmd}: error{where}: lost contact with the other ranks ({type(e).__name__}: {first})",
              file=sys.stderr, flush=True)  # fmt: skip
        return 1
    finally:
        if launched and "lmprefs.runtime.distributed" in sys.modules:
            sys.modules["lmprefs.runtime.distributed"].teardown()


def _end_rank(rc: int) -> NoReturn:
    """End a launched process without the interpreter's finalization. gloo's worker threads outlive
    `destroy_process_group` after a training run (references inside torch keep the group), and one that drops its
    last finished collective, the final barrier, while the interpreter finalizes takes the GIL there: the process
    aborts ("terminate called without an active exception") after its work is done, and the launcher fails the run.
    Every file a command writes is closed when it returns; only the standard streams are flushed here."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(ValueError, OSError):  # closed, or a reader that left
            stream.flush()
    os._exit(rc)


def _close_progress() -> None:
    if "lmprefs.runtime.runlog" in sys.modules:  # a command that never showed a bar need not import torch for it
        sys.modules["lmprefs.runtime.runlog"].close_progress()


def _is_dist_error(e: BaseException) -> bool:
    import torch.distributed as td

    return isinstance(e, td.DistError) or (isinstance(e, RuntimeError) and "Connection closed by peer" in str(e))


if __name__ == "__main__":
    raise SystemExit(main())
