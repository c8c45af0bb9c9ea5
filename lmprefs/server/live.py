"""Running the app on a real socket: `bind` for `lmprefs serve` (so a busy port is a clear error before uvicorn
starts) and `running`, a context manager that serves an app from a background thread, for tests and scripts."""

from __future__ import annotations

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


def server(app, *, log_level: str = "info", access_log: bool = True) -> uvicorn.Server:
    # server_header off: no need to tell the world the server's name and version
    return uvicorn.Server(uvicorn.Config(app, log_level=log_level, access_log=access_log, server_header=False))


@contextmanager
def running(app, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve `app` on host:port from a daemon thread; yields the base URL, stops the server on exit."""
    sock = bind(host, port)
    srv = server(app, log_level="warning", access_log=False)
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
