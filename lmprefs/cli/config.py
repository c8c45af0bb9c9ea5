"""`lmprefs presets` and `lmprefs config`: the presets, and a preset's full config after overrides."""

from __future__ import annotations

from lmprefs.cli.common import command_parser
from lmprefs.errors import UserError

USAGE = {"presets": "lmprefs presets [NAME [--config FILE] [--section.key VALUE ...]]",
         "config": "lmprefs config (PRESET | --config FILE) [--section.key VALUE ...]"}


def cmd_presets(argv: list[str], cmd: str = "presets") -> int:
    """`lmprefs presets`, and `lmprefs config` under its own name (its usage, its help, its errors)."""
    import json

    from lmprefs.config import PRESETS
    from lmprefs.config.overrides import split_overrides, to_dict
    from lmprefs.runtime.resolve import resolve_config

    argv, pairs = split_overrides(argv)
    p = command_parser(cmd, USAGE[cmd])
    p.add_argument("name", nargs="?", help="print this preset's full config as JSON (after any overrides)")
    p.add_argument("--config", help="a saved config.json to start from instead of the preset")
    a = p.parse_args(argv)
    if a.name or a.config or pairs:
        print(json.dumps(to_dict(resolve_config(a.name or "", pairs, a.config)), indent=2))
    else:
        for name, (desc, _) in PRESETS.items():
            print(f"  {name:24s} {desc}")
    return 0


def cmd_config(argv: list[str]) -> int:
    """`lmprefs config PRESET [--section.key V ...]`: the resolved config, as `presets NAME` prints it."""
    from lmprefs.config.overrides import split_overrides

    rest, pairs = split_overrides(argv)
    if not rest and not pairs and "--config" not in argv:
        raise UserError("name a preset (lmprefs presets lists them) or pass --config FILE")
    return cmd_presets(argv, "config")
