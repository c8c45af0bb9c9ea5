"""Free TCP ports for a launch's rendezvous or store, picked now and bound later by another process.

A port the kernel hands out for `bind(("", 0))` comes from its ephemeral range, the range it also takes the local
port of every outgoing connection from: between the pick and the launch's bind, any connection on the machine (a
process group's, a test's, a browser's) can take it, and the launch fails with EADDRINUSE. A port below that range
is taken only by a process that binds it by number, so the ports here are drawn there, each checked free by binding
it on every address, and held until all n are picked (no two the same).
"""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000  # below it: the well-known and registered services' ports a machine is likelier to run
_DEFAULT_EPHEMERAL = 49_152  # IANA's dynamic range, the start of macOS' and Windows' ephemeral ranges


def ephemeral_start(range_file: Path = _RANGE_FILE) -> int:
    """The first port of the kernel's ephemeral range: Linux's ip_local_port_range, else IANA's 49152."""
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _DEFAULT_EPHEMERAL


def free_ports(n: int, range_file: Path = _RANGE_FILE) -> list[int]:
    """n distinct ports free on every address now, below the ephemeral range where it leaves room (at least 1,000
    ports above 10,000); else the kernel's own picks, as `bind(("", 0))` gives them."""
    top = ephemeral_start(range_file)
    rng = random.SystemRandom()
    with contextlib.ExitStack() as held:
        ports: list[int] = []
        tries = 0
        while len(ports) < n:
            tries += 1
            port = rng.randrange(_LOWEST, top) if top - _LOWEST >= 1_000 and tries <= 50 * n else 0
            s = held.enter_context(socket.socket())
            try:
                s.bind(("", port))
            except OSError:  # in use (or in TIME_WAIT): another
                continue
            ports.append(s.getsockname()[1])
        return ports


def free_port(range_file: Path = _RANGE_FILE) -> int:
    """One port as `free_ports` picks them."""
    return free_ports(1, range_file)[0]
