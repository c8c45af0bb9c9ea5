"""`lmprefs assets list|prepare [NAME ...]`: the offline assets and their cache."""

from __future__ import annotations

from lmprefs.cli.common import command_parser


def cmd_assets(argv: list[str]) -> int:
    from lmprefs.assets.cache import AssetError, cache_dir
    from lmprefs.assets.registry import ASSETS, asset_status

    p = command_parser("assets")
    p.add_argument("action", choices=["list", "prepare"], help="list the assets, or prepare (download/convert) them")
    p.add_argument("names", nargs="*", help="assets to prepare (default: all)")
    a = p.parse_args(argv)
    if a.action == "list":
        print(f"cache: {cache_dir()}  (set LMPREFS_CACHE to move it)")
        for name, (desc, _) in ASSETS.items():
            print(f"  {name:16s} {asset_status(name):13s} {desc}")
        return 0
    for name in a.names or list(ASSETS):
        if name not in ASSETS:
            raise AssetError(f"unknown asset {name!r}; assets: {', '.join(ASSETS)}")
        print(f"preparing {name} ...", flush=True)
        print(f"  {name}: {ASSETS[name][1]()}")
    return 0
