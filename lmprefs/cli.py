"""`lmprefs COMMAND ...`: the command line. Each command imports its heavy modules only when it runs.

Config overrides are dotted flags (`--ppo.lr 2e-5`) applied to a preset; a command's own flags are plain
(`--n 4`). A user's mistake (UserError) prints one line and exits 2; nothing else is caught.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lmprefs.errors import UserError

COMMANDS = {
    "assets": "list or prepare the offline assets (SmolLM2, the GPT-2 BPE, Austen)",
    "sample": "print queries and sampled continuations from the initial model or a trained policy",
    "presets": "list the presets, or print one preset's full config",
}


def _parser(cmd: str, usage: str | None = None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=f"lmprefs {cmd}", description=COMMANDS[cmd], usage=usage)


def _config(preset_name: str, pairs, config_file: str | None = None):
    from lmprefs.config import PRESETS, preset
    from lmprefs.overrides import ConfigError, apply_overrides, load_config

    if config_file:
        cfg = load_config(Path(config_file))
    else:
        try:
            cfg = preset(preset_name)
        except KeyError:
            raise ConfigError(f"unknown preset {preset_name!r}; presets: {', '.join(PRESETS)}") from None
    return apply_overrides(cfg, pairs)


def _help_with_config(parser: argparse.ArgumentParser, argv: list[str], preset_name: str) -> None:
    if "-h" in argv or "--help" in argv:
        from lmprefs.config import PRESETS
        from lmprefs.overrides import config_help

        parser.print_help()
        name = preset_name if preset_name in PRESETS else "tiny"
        print("\n" + config_help(PRESETS[name][1]))
        raise SystemExit(0)


# ---------------------------------------------------------------------------------------------------------------


def cmd_assets(argv: list[str]) -> int:
    from lmprefs import assets

    p = _parser("assets")
    p.add_argument("action", choices=["list", "prepare"])
    p.add_argument("names", nargs="*", help="assets to prepare (default: all)")
    a = p.parse_args(argv)
    if a.action == "list":
        print(f"cache: {assets.cache_dir()}  (set LMPREFS_CACHE to move it)")
        for name, (desc, _) in assets.ASSETS.items():
            print(f"  {name:16s} {assets.asset_status(name):13s} {desc}")
        return 0
    for name in a.names or list(assets.ASSETS):
        if name not in assets.ASSETS:
            raise assets.AssetError(f"unknown asset {name!r}; assets: {', '.join(assets.ASSETS)}")
        print(f"preparing {name} ...", flush=True)
        print(f"  {name}: {assets.ASSETS[name][1]()}")
    return 0


def cmd_presets(argv: list[str]) -> int:
    import json

    from lmprefs.config import PRESETS
    from lmprefs.overrides import to_dict

    p = _parser("presets")
    p.add_argument("name", nargs="?")
    a = p.parse_args(argv)
    if a.name:
        print(json.dumps(to_dict(_config(a.name, [])), indent=2))
    else:
        for name, (desc, _) in PRESETS.items():
            print(f"  {name:24s} {desc}")
    return 0


def cmd_sample(argv: list[str]) -> int:
    from lmprefs.overrides import split_overrides

    argv, pairs = split_overrides(argv)
    p = _parser("sample", "lmprefs sample [RUN_DIR] [--preset NAME] [--n N] [--temperature T] [--section.key V ...]")
    p.add_argument("run_dir", nargs="?", help="a train-policy run directory (default: the preset's initial model)")
    p.add_argument("--preset", default="austen-sentiment", help="preset naming the task and initial model")
    p.add_argument("--n", type=int, default=4, help="number of queries to continue")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (default: the task's; the original's sample.py used 1.0 for runs)")
    p.add_argument("--seed", type=int, default=None, help="seed (default: run.seed)")
    p.add_argument("--split", choices=["train", "heldout"], default="heldout", help="which queries to draw from")
    _help_with_config(p, argv, "austen-sentiment")
    a = p.parse_args(argv)
    from lmprefs.generate import sample_cli

    return sample_cli(a, pairs)


HANDLERS = {"assets": cmd_assets, "sample": cmd_sample, "presets": cmd_presets}


def register(name: str, help_text: str, handler) -> None:
    COMMANDS[name] = help_text
    HANDLERS[name] = handler


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print("usage: lmprefs COMMAND [ARGS]   (lmprefs COMMAND --help for each)\n\ncommands:")
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
    try:
        return HANDLERS[cmd](rest) or 0
    except UserError as e:
        print(f"lmprefs {cmd}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lmprefs {cmd}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
