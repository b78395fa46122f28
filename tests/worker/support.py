"""Helpers for the worker tests: waiting, and worker subprocesses."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

from django.db import connection, connections

ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate, timeout: float = 20, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def wait_until_up(names: list[str], timeout: float = 60) -> None:
    """Every named worker process has written its heartbeat: it is claiming, and
    its SIGTERM handler is in place (installed before the first heartbeat), so a
    SIGTERM from the test drains it instead of killing it mid-start."""
    from everystep.models import Heartbeat

    wait_for(
        lambda: Heartbeat.objects.filter(name__in=names).count() == len(names),
        timeout=timeout,
        what=f"workers {', '.join(names)} to be up",
    )


def vendor() -> str:
    return connection.vendor


def database_env() -> dict:
    """Environment naming the *test* databases, for a worker subprocess."""
    env = {"EVERYSTEP_TEST_DATABASE_URL": database_url(connections["default"])}
    if "engine" in connections:  # EVERYSTEP_TEST_SPLIT: everystep's tables in their own database
        env["EVERYSTEP_TEST_ENGINE_DATABASE_URL"] = database_url(connections["engine"])
    return env


def database_url(conn) -> str:
    settings = conn.settings_dict
    if conn.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    scheme = {"postgresql": "postgres", "mysql": "mysql"}[conn.vendor]
    user = quote(settings["USER"] or "")
    password = f":{quote(settings['PASSWORD'])}" if settings["PASSWORD"] else ""
    host = settings["HOST"] or "127.0.0.1"
    port = f":{settings['PORT']}" if settings["PORT"] else ""
    return f"{scheme}://{user}{password}@{host}{port}/{settings['NAME']}"


class WorkerProcess:
    """``python -m django everystep_worker`` in a subprocess, its output in a file;
    on the test database unless given another ``database_url``."""

    def __init__(
        self, name: str, args: list, output: Path, *, database_url: str | None = None,
        extra_env: dict | None = None,
    ):
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
        for key in ("EVERYSTEP_TEST_DATABASE_URL", "EVERYSTEP_TEST_ENGINE_DATABASE_URL"):
            env.pop(key, None)
        if database_url:  # one database of another server: everything in it
            env.pop("EVERYSTEP_TEST_SPLIT", None)
            env["EVERYSTEP_TEST_DATABASE_URL"] = database_url
        else:
            env.update(database_env())
        env.update(extra_env or {})  # e.g. other settings
        self.name = name
        self.output = output
        self._file = open(output, "ab")  # noqa: SIM115  (closed in wait())
        self.process = subprocess.Popen(
            [sys.executable, "-m", "django", "everystep_worker", "--name", name, *args],
            cwd=ROOT,
            env=env,
            stdout=self._file,
            stderr=subprocess.STDOUT,
        )

    def signal(self, signum) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            if self.process.returncode is not None:
                self._file.close()

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.output.read_text(errors="replace")


THROWAWAY = "throwaway"  # the Django alias of a database on the test's own PostgreSQL server


class ToThrowaway:
    """A database router: every query of the test process goes to ``THROWAWAY``."""

    def db_for_read(self, model, **hints):
        return THROWAWAY

    def db_for_write(self, model, **hints):
        return THROWAWAY


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_and_join(worker, timeout: float = 30) -> None:
    worker.stop()
    worker.thread.join(timeout)
    assert not worker.thread.is_alive(), f"worker {worker.name} did not stop"
