"""`lmprefs push`: a finished run's policy and reward model, with their model cards, to the Hugging Face hub."""

from __future__ import annotations

import os
from pathlib import Path

from lmprefs.cli.common import command_parser
from lmprefs.errors import UserError
from lmprefs.io.inputs import file_in_the_way, input_dir

USAGE = "lmprefs push RUN --repo NAME [--private] [--what policy|reward-model|all] [--hub-dir DIR]"


def cmd_push(argv: list[str]) -> int:
    from lmprefs.recipes.push import HUB_DIR_ENV, WHAT

    p = command_parser("push", USAGE)
    p.add_argument("run", metavar="RUN", help="a finished train-policy, quickstart or train-dpo run directory")
    p.add_argument("--repo", required=True,
                   help="the hub repo, NAME or OWNER/NAME (created if missing); with --what all the reward model goes "
                   "to NAME-reward-model")  # fmt: skip
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--what", choices=WHAT, default="all",
                   help="what to upload: the final policy, the reward model, or both (default; the reward model where "
                   "the run has one)")  # fmt: skip
    p.add_argument("--hub-dir", default=os.environ.get(HUB_DIR_ENV) or None,
                   help=f"copy to DIR/NAME instead of uploading: a local folder standing in for the hub (default "
                   f"${HUB_DIR_ENV}; unset: the hub)")  # fmt: skip
    a = p.parse_args(argv)
    from lmprefs.recipes.push import push_run

    run = input_dir(a.run, "RUN", "run directory")
    named = None
    if a.hub_dir:  # given, or $LMPREFS_HUB_DIR: a bad one is named as what gave it
        given = any(x == "--hub-dir" or x.startswith("--hub-dir=") for x in argv)
        named = f"--hub-dir {a.hub_dir}" if given else f"{HUB_DIR_ENV}={a.hub_dir} (environment)"
        _check_hub_dir(Path(a.hub_dir), named)
    where = f"{a.hub_dir}/" if a.hub_dir else "https://huggingface.co/"
    for up, files in push_run(run, a.repo, a.what, a.private, a.hub_dir, hub_named=named):
        print(f"{up.what}: {len(files)} files from {up.source} -> {where}{up.repo}")
    return 0


def _check_hub_dir(hub: Path, named: str) -> None:
    """The stand-in folder must be one, or be makeable: a file at it or above it is refused before anything is
    staged (mkdir would raise NotADirectoryError deep in the copy)."""
    if (f := file_in_the_way(hub)) == hub:
        raise UserError(f"{named}: is a file, expected the folder standing in for the hub")
    if f is not None:
        raise UserError(f"{named}: {f} is a file, not a folder")
