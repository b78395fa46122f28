"""A PostgreSQL server of our own, for the tests and the soak that restart one.

``ThrowawayPostgres`` makes a fresh cluster with the installed server binaries
(``initdb``, trust authentication, superuser ``postgres``) in a temporary
directory, and serves it on a free port of 127.0.0.1 with its socket in that
directory, so that restarting it can touch no other server on the machine.
Stopping it (also when the code using it fails: use it as a context manager)
shuts the server down and removes the directory.

PostgreSQL refuses to run as root: as root, the server runs as the
``postgres`` account (the one packaged clusters run as), which then owns the
directory.
"""

import contextlib
import datetime as dt
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.throwaway import run_as, start_on_a_free_port

SUPERUSER = "postgres"


class PostgresUnavailable(RuntimeError):
    """No server binaries, or no account to run them as."""


class ServerCommandFailed(RuntimeError):
    """initdb or pg_ctl failed; the message holds their output and the server log."""


def server_bindir() -> Path:
    """The directory of ``initdb`` and ``pg_ctl``: ``pg_config --bindir``, else
    the newest ``/usr/lib/postgresql/<version>/bin`` (Debian), else the PATH."""
    candidates = []
    try:
        found = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
        candidates.append(Path(found.stdout.strip()))
    except (OSError, subprocess.CalledProcessError):
        pass
    versions = Path("/usr/lib/postgresql").glob("*/bin")
    candidates += sorted(versions, key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.name)],
                         reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    raise PostgresUnavailable(
        "the restart and outage tests start a PostgreSQL server of their own, but no server "
        "binaries were found (initdb and pg_ctl: not in `pg_config --bindir`, "
        "/usr/lib/postgresql/*/bin or the PATH). Install the PostgreSQL server package "
        "(Debian: postgresql)."
    )


class ThrowawayPostgres:
    """``with ThrowawayPostgres() as server:`` a running server, gone afterwards."""

    def __init__(self):
        self.bindir = server_bindir()
        self._account = run_as(SUPERUSER, PostgresUnavailable(
            "PostgreSQL does not run as root, and there is no 'postgres' account to run "
            "the throwaway server as"
        ))
        self.directory: Path | None = None
        self.port: int | None = None

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def logfile(self) -> Path:
        return self.directory / "server.log"

    # ------------------------------------------------------------ lifecycle

    def start(self) -> "ThrowawayPostgres":
        """initdb, then start on a free port and wait until it accepts connections."""
        self.directory = Path(tempfile.mkdtemp(prefix="everystep-pg-"))
        start_on_a_free_port(self, self._initdb, self._start_on, failure=ServerCommandFailed,
                             port_taken=lambda: "could not bind" in self._log_tail())
        return self

    def restart(self) -> None:
        """Stop (``fast``: every session is cut off, as in a real restart) and start
        again on the same port; returns once it accepts connections."""
        # The log file keeps the new postmaster off our pipes (we would wait on them forever).
        self._pg("pg_ctl", "restart", "-D", str(self.data), "-l", str(self.logfile), "-m", "fast",
                 "-w", "-t", "60")

    def stop(self) -> None:
        """Shut the server down (its data is thrown away: no checkpoint) and remove it."""
        if self.directory is None:
            return
        if (self.data / "postmaster.pid").exists():
            # If this fails the directory goes anyway: a postmaster whose lock file
            # is gone shuts itself down.
            with contextlib.suppress(ServerCommandFailed):
                self._pg("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w", "-t", "60")
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory = None

    def __enter__(self) -> "ThrowawayPostgres":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # ------------------------------------------------------------ using it

    def url(self, database: str = "postgres") -> str:
        return f"postgres://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres"):
        import psycopg

        return psycopg.connect(self.url(database), autocommit=True, connect_timeout=10)

    def create_database(self, name: str) -> str:
        """Create ``name`` and return its URL."""
        with self.connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def start_time(self) -> dt.datetime:
        """When the server (its postmaster) last started: changes with each restart."""
        with self.connect() as conn:
            return conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0]

    # ------------------------------------------------------------ internals

    def _initdb(self) -> None:
        if self._account is not None:
            os.chown(self.directory, self._account.pw_uid, self._account.pw_gid)
        self._pg("initdb", "-D", str(self.data), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--no-sync")

    def _start_on(self, port: int) -> None:
        self.port = port
        options = f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='{self.directory}'"
        self._pg("pg_ctl", "start", "-D", str(self.data), "-l", str(self.logfile), "-w", "-t", "60",
                 "-o", options)

    def _pg(self, program: str, *args: str) -> None:
        command = [str(self.bindir / program), *args]
        if self._account is not None:
            command = ["runuser", "-u", self._account.pw_name, "--", *command]
        # The server's account may not be allowed into our working directory.
        done = subprocess.run(command, cwd=self.directory, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=120)
        if done.returncode:
            raise ServerCommandFailed(
                f"{' '.join(command)} failed (exit {done.returncode}): "
                f"{(done.stdout + done.stderr).strip()[-1500:]}\n--- server log ---\n{self._log_tail()}"
            )

    def _log_tail(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")[-1500:]
        except OSError:
            return "(no server log)"
