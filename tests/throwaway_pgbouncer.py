"""A PgBouncer of our own, in transaction pooling, for the tests and the soak
that run the engine behind one.

``ThrowawayPgBouncer(host, port)`` writes an ini file and a user list to a
temporary directory and runs the installed ``pgbouncer`` on a free port of
127.0.0.1 (no Unix socket), forwarding every database name to the PostgreSQL
server at ``host:port`` (authentication: trust, user ``postgres``). At most
``pool_size`` server connections per database and user: clients beyond that
wait for one, which is what the fleet test wants to see.

``prepared_statements=True`` takes a PgBouncer that keeps prepared statements
in transaction pooling (1.21 or later, ``max_prepared_statements``): the
installed one if it is that new, else the one ``scripts/pgbouncer`` builds
(Debian 12 ships 1.18). Without it, a PgBouncer of 1.21 or later is told
``max_prepared_statements = 0``, so that both behave as 1.18 does.

``restart()`` kills the process (SIGKILL: every client connection is cut off)
and starts it again on the same port. Stopping it (also when the code using
it fails: use it as a context manager) kills it and removes the directory.
Nothing else on the machine is touched.

PgBouncer refuses to run as root: as root, it drops to the ``postgres``
account (``pgbouncer -u``), which then owns the directory.
"""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import NoReturn

from tests.throwaway import run_as, start_on_a_free_port

USER = "postgres"
# The first PgBouncer that follows protocol-level prepared statements in transaction pooling.
PREPARED_STATEMENTS_SINCE = (1, 21)
# Each client's statements PgBouncer keeps (and prepares again on whichever
# server connection it lends that client): more than everystep has.
MAX_PREPARED_STATEMENTS = 100
BUILT = Path(__file__).resolve().parent.parent / ".cache"  # where scripts/pgbouncer builds it


class PgBouncerUnavailable(RuntimeError):
    """No ``pgbouncer`` program, or no account to run it as."""


class PgBouncerFailed(RuntimeError):
    """PgBouncer exited or never listened; the message holds its log."""


def pgbouncer_program() -> str:
    found = shutil.which("pgbouncer") or next(
        (path for path in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(path, os.X_OK)), None
    )
    if found is None:
        raise PgBouncerUnavailable(
            "the PgBouncer tests start a PgBouncer of their own, but no `pgbouncer` program was "
            "found (PATH, /usr/sbin). Install it (Debian: apt-get install pgbouncer)."
        )
    return found


def prepared_statements_program() -> str:
    """A PgBouncer of 1.21 or later: the installed one, else ``scripts/pgbouncer``'s build."""
    candidates = [*BUILT.glob("pgbouncer-*/bin/pgbouncer")]
    with contextlib.suppress(PgBouncerUnavailable):
        candidates.insert(0, pgbouncer_program())
    for program in candidates:
        if version_number(program) >= PREPARED_STATEMENTS_SINCE:
            return str(program)
    found = ", ".join(f"{program} ({version(program)})" for program in candidates) or "none"
    raise PgBouncerUnavailable(
        "the tests of prepared statements through PgBouncer need PgBouncer 1.21 or later "
        f"(found: {found}). Run scripts/pgbouncer to build one (Debian 12 ships 1.18)."
    )


def program_for(prepared_statements: bool) -> str:
    """The PgBouncer to run: one that keeps prepared statements (1.21 or later), or any."""
    return prepared_statements_program() if prepared_statements else pgbouncer_program()


def pgbouncer_or_skip(prepared_statements: bool = False) -> str:
    """The ``pgbouncer`` program a PgBouncer test runs (:func:`program_for`); a
    missing one skips the test (:func:`skip_or_fail`)."""
    try:
        return program_for(prepared_statements)
    except PgBouncerUnavailable as exc:
        skip_or_fail(exc)


def skip_or_fail(exc: PgBouncerUnavailable) -> NoReturn:
    """Skip the test that has no PgBouncer to run, unless
    EVERYSTEP_REQUIRE_PGBOUNCER=1 (CI) makes that a failure."""
    import pytest

    if os.environ.get("EVERYSTEP_REQUIRE_PGBOUNCER") == "1":
        pytest.fail(f"EVERYSTEP_REQUIRE_PGBOUNCER=1 but {exc}")
    pytest.skip(str(exc))


def version(program: str) -> str:
    """``PgBouncer 1.18.0``: the first line of ``<program> --version``."""
    done = subprocess.run([program, "--version"], capture_output=True, text=True, check=True)
    return done.stdout.splitlines()[0].strip()


def version_number(program: str) -> tuple[int, ...]:
    """``(1, 18, 0)`` for ``PgBouncer 1.18.0``; ``()`` if it names none."""
    found = re.search(r"\d+(?:\.\d+)+", version(program))
    return tuple(int(part) for part in found[0].split(".")) if found else ()


class ThrowawayPgBouncer:
    """``with ThrowawayPgBouncer("127.0.0.1", 5432) as bouncer:`` a running PgBouncer, gone afterwards."""

    def __init__(self, host: str, port: int | str, *, pool_size: int = 2, prepared_statements: bool = False):
        self.program = program_for(prepared_statements)
        self.target = (host or "127.0.0.1", int(port or 5432))
        self.pool_size = pool_size
        self.prepared_statements = prepared_statements
        self._account = run_as(USER, PgBouncerUnavailable(
            "PgBouncer does not run as root, and there is no 'postgres' account to run it as"
        ))
        self.directory: Path | None = None
        self.port: int | None = None
        self.process: subprocess.Popen | None = None

    def version(self) -> str:
        return version(self.program)

    @property
    def logfile(self) -> Path:
        return self.directory / "pgbouncer.log"

    # ------------------------------------------------------------ lifecycle

    def start(self) -> "ThrowawayPgBouncer":
        self.directory = Path(tempfile.mkdtemp(prefix="everystep-pgbouncer-"))
        start_on_a_free_port(self, self._write_users, self._start_on, failure=PgBouncerFailed,
                             port_taken=lambda: "Address already in use" in self.log())
        return self

    def restart(self) -> None:
        """Kill it (SIGKILL: no goodbye to any client or server) and start it again on the same port."""
        self._kill()
        self._launch()

    def stop(self) -> None:
        if self.directory is None:
            return
        self._kill()
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory = None

    def __enter__(self) -> "ThrowawayPgBouncer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # ------------------------------------------------------------ using it

    def url(self, database: str) -> str:
        return f"postgres://{USER}@127.0.0.1:{self.port}/{database}"

    def show(self, what: str) -> list[dict]:
        """``SHOW <what>`` on PgBouncer's admin console (``STATS``, ``POOLS``, ``SERVERS``...)."""
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(self.url("pgbouncer"), autocommit=True, connect_timeout=10) as conn:
            # The admin console speaks the simple query protocol only.
            return conn.cursor(row_factory=dict_row).execute(f"SHOW {what}", prepare=False).fetchall()

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except (OSError, TypeError):
            return "(no log)"

    # ------------------------------------------------------------ internals

    def _write_users(self) -> None:
        (self.directory / "users.txt").write_text(f'"{USER}" ""\n')

    def _start_on(self, port: int) -> None:
        self.port = port
        self._write_ini()
        self._launch()

    def _write_ini(self) -> None:
        host, port = self.target
        ini = f"""\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.directory / "users.txt"}
admin_users = {USER}
pool_mode = transaction
default_pool_size = {self.pool_size}
max_client_conn = 500
logfile = {self.logfile}
; the short test runs make and break many connections
server_login_retry = 1
"""
        if version_number(self.program) >= PREPARED_STATEMENTS_SINCE:
            kept = MAX_PREPARED_STATEMENTS if self.prepared_statements else 0
            ini += f"max_prepared_statements = {kept}\n"
        (self.directory / "pgbouncer.ini").write_text(ini)
        if self._account is not None:
            for path in (self.directory, *self.directory.iterdir()):
                os.chown(path, self._account.pw_uid, self._account.pw_gid)

    def _launch(self) -> None:
        command = [self.program, str(self.directory / "pgbouncer.ini")]
        if self._account is not None:
            command[1:1] = ["-u", self._account.pw_name]
        self.process = subprocess.Popen(
            command, cwd=self.directory, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PgBouncerFailed(f"pgbouncer exited ({self.process.returncode}):\n{self.log()[-1500:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self._kill()
        raise PgBouncerFailed(
            f"pgbouncer did not listen on port {self.port} within 30 s:\n{self.log()[-1500:]}"
        )

    def _kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        self.process = None
