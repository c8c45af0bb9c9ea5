"""`lmprefs serve` (the labeling web app) and `lmprefs labelers` (add, list, revoke sign-in tokens)."""

from __future__ import annotations

import sys

from lmprefs.cli.common import ArgumentParser
from lmprefs.errors import UserError
from lmprefs.labels.store import LabelStore, check_name, check_store_path


def _existing_store(db: str) -> LabelStore:
    return LabelStore(check_store_path(db, must_exist=True))


def _serve_parser() -> ArgumentParser:
    from lmprefs.server.instructions import TASKS

    p = ArgumentParser(
        prog="lmprefs serve",
        description="Run the labeling web app over a label store. Sign in with a token from `lmprefs labelers add`.",
    )
    p.add_argument("--db", default="labels.sqlite", help="label store (SQLite file; must exist)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    p.add_argument("--task", default="sentiment", choices=sorted(TASKS), help="whose instructions labelers see")
    p.add_argument("--batch", default=None, help="serve only items of this batch")
    p.add_argument("--lease-minutes", type=float, default=15, help="how long a shown item is kept for its labeler")
    p.add_argument("--gold-rate", type=float, default=0.1,
                   help="share of served items that are gold questions (marked on the admin page), unannounced")
    p.add_argument("--overlap", type=float, default=0.0,
                   help="share of items that go to --overlap-k labelers, to measure agreement (e.g. 0.1; it raises "
                        "those items' wanted labels in the store)")  # fmt: skip
    p.add_argument("--overlap-k", type=int, default=3, help="labelers per shared item")
    p.add_argument("--no-shuffle", action="store_true", help="show options in stored order (no position-bias check)")
    p.add_argument("--undo-seconds", type=float, default=60, help="how long a labeler can change an answer")
    p.add_argument("--fast-seconds", type=float, default=3, help="answers quicker than this are marked too fast")
    p.add_argument("--onboarding", type=int, default=None, metavar="N",
                   help="new labelers first answer N gold questions as practice, with the right answer after each "
                        "(0: off; saved in the store, the admin page edits it)")  # fmt: skip
    p.add_argument("--admit-accuracy", type=float, default=None, metavar="A",
                   help="practice accuracy that admits a new labeler (default 0.8; saved in the store)")
    p.add_argument("--anchor-every", type=int, default=None, metavar="N",
                   help="serve every drift anchor to each labeler again in each interval of N of their labels (0: "
                        "off; saved in the store, the admin page edits it)")  # fmt: skip
    p.add_argument("--trusted-proxy", action="append", default=[], metavar="ADDRESS",
                   help="address or network (10.0.0.0/8) of a reverse proxy in front of the app whose "
                        "X-Forwarded-For and -Proto are believed (repeatable; default: believe no one)")  # fmt: skip
    return p


def _check_serve_flags(a) -> None:
    """One line naming the first bad flag, before anything is opened."""
    if not 0 <= a.port <= 65535:
        raise UserError(f"--port {a.port}: must be 0..65535")
    if not 0 < a.lease_minutes < float("inf"):  # nan passed `<= 0` and served items under a lease of nan seconds
        raise UserError(f"--lease-minutes {a.lease_minutes:g}: must be a positive number of minutes")
    for flag, value in (("--gold-rate", a.gold_rate), ("--overlap", a.overlap)):
        if not 0 <= value <= 1:
            raise UserError(f"{flag} {value}: must be in [0, 1]")
    if not 2 <= a.overlap_k <= 100:
        raise UserError(f"--overlap-k {a.overlap_k}: must be 2..100")
    for flag, value in (("--undo-seconds", a.undo_seconds), ("--fast-seconds", a.fast_seconds)):
        if not 0 <= value < 86400:
            raise UserError(f"{flag} {value}: must be in [0, 86400)")
    if a.onboarding is not None and not 0 <= a.onboarding <= 1000:
        raise UserError(f"--onboarding {a.onboarding}: must be 0..1000 practice questions")
    if a.admit_accuracy is not None and not 0 <= a.admit_accuracy <= 1:
        raise UserError(f"--admit-accuracy {a.admit_accuracy}: must be in [0, 1]")
    if a.anchor_every is not None and not 0 <= a.anchor_every <= 100_000:
        raise UserError(f"--anchor-every {a.anchor_every}: must be 0..100000 labels (0: off)")


def _save_settings(store: LabelStore, a) -> None:
    """The onboarding and drift settings given on the command line, kept in the store (the admin page edits them)."""
    if a.onboarding is not None or a.admit_accuracy is not None:
        items, bar = store.onboarding_settings()
        store.set_onboarding(items if a.onboarding is None else a.onboarding,
                             bar if a.admit_accuracy is None else a.admit_accuracy)  # fmt: skip
    if a.anchor_every is not None:
        store.set_anchor_every(a.anchor_every)


def _bind_fix(e: OSError) -> str:
    """What to change when the socket cannot listen: a host that is no address of this machine (unknown, or
    another's) is not fixed by another port."""
    import errno
    import socket

    if isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL:
        return "--host must be an address of this machine (127.0.0.1, or 0.0.0.0 for every interface)"
    return "pass a free --port, or 0"


def cmd_serve(argv: list[str]) -> int:
    a = _serve_parser().parse_args(argv)
    _check_serve_flags(a)
    from lmprefs.server.live import proxy_addresses

    try:
        trusted = proxy_addresses(a.trusted_proxy)
    except ValueError as e:
        raise UserError(f"--trusted-proxy {e}") from None
    store = _existing_store(a.db)
    if a.batch is not None and not store.item_count(batch=a.batch):
        known = sorted(set(store.item_batches("").values()) - {None})
        store.close()
        raise UserError(f"--batch {a.batch!r}: {a.db} holds no items of that batch"
                        + (f" (its batches: {', '.join(known[:8])})" if known else " (its items have no batch)"))
    from lmprefs.server.app import create_app
    from lmprefs.server.live import LOOPBACK, bind, server, url

    try:  # before the settings are saved: a serve that cannot listen leaves the store as it was
        sock = bind(a.host, a.port)
    except OSError as e:
        store.close()
        raise UserError(f"cannot listen on {a.host}:{a.port} ({e.strerror or e}); {_bind_fix(e)}") from None
    _save_settings(store, a)
    tokens = store.labelers_with_tokens()
    pending = store.pending_count(batch=a.batch)
    store.close()
    loopback = a.host in LOOPBACK or a.host.startswith("127.")
    hosts = ["127.0.0.1", "localhost", "::1", "[::1]", a.host] if loopback else None  # no DNS-rebinding onto loopback
    app = create_app(a.db, a.task, batch=a.batch, lease_seconds=a.lease_minutes * 60, allowed_hosts=hosts,
                     shuffle=not a.no_shuffle, gold_rate=a.gold_rate, overlap_fraction=a.overlap,
                     overlap_k=a.overlap_k, undo_seconds=a.undo_seconds, fast_seconds=a.fast_seconds)  # fmt: skip
    if not loopback:
        print(f"lmprefs serve: warning: listening on {a.host}, reachable from other machines over plain HTTP; "
              "put it behind HTTPS before labelers send tokens over a network", file=sys.stderr)  # fmt: skip
    print(f"lmprefs serve: {url(sock)}/  task {a.task}, {pending} items pending, {tokens} labelers with tokens"
          + ("" if tokens else f" (add one: lmprefs labelers add NAME --admin --db {a.db})"), flush=True)  # fmt: skip
    try:
        server(app, trusted_proxies=trusted).run(sockets=[sock])  # returns after Ctrl-C
    finally:
        sock.close()
    return 0


def cmd_labelers(argv: list[str]) -> int:
    p = ArgumentParser(prog="lmprefs labelers", description="Manage who can sign in to `lmprefs serve`.")
    sub = p.add_subparsers(dest="action", required=True, metavar="{add,list,revoke}")
    add = sub.add_parser("add", help="register NAME and print a new sign-in token (shown once)")
    add.add_argument("name", help="the labeler's name (shown on their labels)")
    add.add_argument("--admin", action="store_true", help="may see the admin page and export labels")
    add.add_argument("--db", default="labels.sqlite", help="label store (created if missing)")
    ls = sub.add_parser("list", help="labelers, their roles and answer counts")
    ls.add_argument("--db", default="labels.sqlite", help="label store (must exist)")
    rm = sub.add_parser("revoke", help="invalidate NAME's token and sessions (then `add NAME` issues a new one)")
    rm.add_argument("name", help="the labeler whose token to revoke")
    rm.add_argument("--db", default="labels.sqlite", help="label store (must exist)")
    a = p.parse_args(argv)

    if a.action == "add":
        try:  # before the store is opened: opening a new one creates it, and a refused name must leave nothing
            check_name(a.name)
        except ValueError as e:
            raise UserError(str(e)) from None
        store = LabelStore(check_store_path(a.db, must_exist=False))
        try:
            token = store.add_labeler(a.name, admin=a.admin)
        except ValueError as e:
            fix = f"; run `lmprefs labelers revoke {a.name}` first" if "already has a token" in str(e) else ""
            raise UserError(f"{e}{fix}") from None
        role = "admin" if a.admin else "labeler"
        print(f"{role} {a.name!r} added to {a.db}; the sign-in token below is shown only once:", file=sys.stderr)
        print(token)  # alone on stdout, so TOKEN=$(lmprefs labelers add NAME) works
        return 0

    store = _existing_store(a.db)
    if a.action == "revoke":
        if not store.revoke_token(a.name):
            raise UserError(f"no labeler named {a.name!r} in {a.db}; `lmprefs labelers list` shows them")
        print(f"revoked the token of {a.name!r}; their open sessions end at their next request")
        return 0

    counts = store.counts_by_labeler()
    print(f"{'name':24s} {'role':8s} {'token':6s} {'labels':>7s} {'skips':>6s} {'flags':>6s}")
    for labeler in store.labelers():
        c = counts.get(labeler.name, {})
        print(f"{labeler.name:24s} {'admin' if labeler.is_admin else 'labeler':8s} "
              f"{'yes' if labeler.has_token else 'no':6s} "
              f"{c.get('label', 0):7d} {c.get('skip', 0):6d} {c.get('flag', 0):6d}")  # fmt: skip
    return 0
