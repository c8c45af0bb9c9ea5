"""Running the app on a real socket: `bind` for `lmprefs serve` (so a busy port is a clear error before uvicorn
starts) and `running`, a context manager that serves an app from a background thread, for tests and scripts."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free port). Raises OSError if it cannot listen."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart at once after Ctrl-C (TIME_WAIT)
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def server(
    app, *, log_level: str = "info", access_log: bool = True, trusted_proxies: list[str] | None = None
) -> uvicorn.Server:
    """A uvicorn server for `app`. `X-Forwarded-For` and `X-Forwarded-Proto` are read only from the addresses or
    networks in `trusted_proxies` (none by default): uvicorn would trust them from 127.0.0.1, so anything on this
    machine could pose as any address (and dodge the wrong-token throttle) or as HTTPS."""
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=access_log,
        server_header=False,  # no need to tell the world the server's name and version
        proxy_headers=bool(trusted_proxies),
        forwarded_allow_ips=list(trusted_proxies or []),
    )
    return uvicorn.Server(config)


def proxy_addresses(values: list[str]) -> list[str]:
    """The `--trusted-proxy` values, each an IP address or network (10.0.0.0/8); raises ValueError naming a bad
    one. A name or `*` is refused: the proxy must be the one machine (or network) the admin runs."""
    for value in values:
        try:
            ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address or network (like 127.0.0.1 or 10.0.0.0/8)") from None
    return values


@contextmanager
def running(
    app, host: str = "127.0.0.1", port: int = 0, *, trusted_proxies: list[str] | None = None
) -> Iterator[str]:
    """Serve `app` on host:port from a daemon thread; yields the base URL, stops the server on exit."""
    sock = bind(host, port)
    srv = server(app, log_level="warning", access_log=False, trusted_proxies=trusted_proxies)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield url(sock)
    finally:
        srv.should_exit = True
        thread.join(10)
        sock.close()
