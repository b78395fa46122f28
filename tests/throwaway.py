"""What the throwaway servers (tests/throwaway_postgres.py,
tests/throwaway_pgbouncer.py) share: the account they run as when we are root,
and starting on a free port of 127.0.0.1, removed again if the start fails."""

import os
import pwd
import socket
from collections.abc import Callable

_PORT_ATTEMPTS = 3  # another process may take the free port before the server binds it


def run_as(account: str, unavailable: Exception):
    """The account a server that refuses to run as root runs as: ``None`` unless
    we are root; ``unavailable`` is raised when root has no such account."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(account)
    except KeyError:
        raise unavailable from None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_on_a_free_port(
    server,
    prepare: Callable[[], None],
    launch: Callable[[int], None],
    *,
    failure: type[Exception],
    port_taken: Callable[[], bool],
) -> None:
    """``prepare()``, then ``launch(port)`` on a free port, and on another one if
    it fails (``failure``) because someone bound the port first (``port_taken()``
    says so, from the server's log). Whatever fails, ``server.stop()`` removes
    what was made before the error goes on: the caller has no server to stop."""
    try:
        prepare()
        for attempt in range(_PORT_ATTEMPTS):
            try:
                launch(free_port())
                return
            except failure:
                if attempt == _PORT_ATTEMPTS - 1 or not port_taken():
                    raise
    except BaseException:
        server.stop()
        raise
