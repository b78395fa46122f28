"""Shared by the benchmarks: Django set-up on a database of the run's own,
worker processes, medians and tables."""

import atexit
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parent.parent
LOGDIR = Path(tempfile.gettempdir()) / "everystep-bench-logs"  # worker logs of the last run
LOGDIR.mkdir(exist_ok=True)
# The server, and the prefix of the databases made on it, unless
# EVERYSTEP_BENCH_DATABASE_URL names others.
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/everystep_bench"


def setup(label: str, *, keep: bool = False) -> None:
    """Make a database for this run, migrate it, and load Django on it.

    The database is ``<name>_<label>_<pid>_<random>`` on the server of
    ``EVERYSTEP_BENCH_DATABASE_URL`` (``<name>`` is the database that URL
    names), dropped when the run ends, also when it fails. With ``keep`` it is
    ``<name>_<label>`` instead, created if missing and kept for the next run
    (a data set worth reusing). Worker processes started afterwards inherit the
    database through the environment."""
    url = os.environ.get("EVERYSTEP_BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    os.environ["EVERYSTEP_BENCH_DATABASE_URL"] = (
        kept_database(url, label) if keep else scratch_database(url, label)
    )
    load_django()


def load_django() -> None:
    """Load Django on the database of ``EVERYSTEP_BENCH_DATABASE_URL`` and migrate it."""
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def scratch_database(url: str, label: str) -> str:
    """Create ``<name>_<label>_<pid>_<random>`` next to the database ``url``
    names, and drop it when this process exits (normally, by an exception,
    Ctrl-C or SIGTERM); returns its URL."""
    suffix = f"_{label}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    name = _database_name(url)[: 63 - len(suffix)] + suffix  # PostgreSQL's limit
    with _admin(url) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    atexit.register(_drop, url, name)
    exit_on_sigterm()
    print(f"database {name} (dropped at exit)", flush=True)
    return urlparse(url)._replace(path=f"/{name}").geturl()


def kept_database(url: str, label: str) -> str:
    """``<name>_<label>`` next to the database ``url`` names, created if missing; its URL."""
    name = f"{_database_name(url)}_{label}"
    with _admin(url) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            admin.execute(f'CREATE DATABASE "{name}"')
    print(f"database {name} (kept: DROP DATABASE {name} when done with it)", flush=True)
    return urlparse(url)._replace(path=f"/{name}").geturl()


def everystep_tables() -> str:
    """Every everystep table, comma-separated, for one ``TRUNCATE``: PostgreSQL
    refuses to truncate the runs while a table whose foreign key points at them
    is left out, so the list follows the models rather than being written out."""
    from django.apps import apps

    return ", ".join(model._meta.db_table for model in apps.get_app_config("everystep").get_models())


def exit_on_sigterm() -> None:
    """Turn SIGTERM into a normal exit, so that ``finally`` blocks and exit
    handlers (which drop scratch databases, stop servers) run."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def _database_name(url: str) -> str:
    return urlparse(url).path.lstrip("/") or "everystep_bench"


def _admin(url: str):
    """An autocommit connection to the server's ``postgres`` database."""
    import psycopg

    parsed = urlparse(url)
    return psycopg.connect(
        host=parsed.hostname or "127.0.0.1", port=parsed.port or 5432, user=unquote(parsed.username or ""),
        password=unquote(parsed.password or "") or None, dbname="postgres", autocommit=True,
    )


def connection_params(db: dict) -> dict:
    """``psycopg.connect()``'s arguments for a Django ``DATABASES`` entry, its
    password included: a server that asks for one refuses a connection without."""
    return {"host": db["HOST"], "port": db["PORT"] or 5432, "user": db["USER"],
            "password": db.get("PASSWORD") or None, "dbname": db["NAME"]}


def _drop(url: str, name: str) -> None:
    try:
        with _admin(url) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # FORCE: our own sessions
    except Exception as exc:  # at exit: say so, there is nothing else to do
        print(f"could not drop database {name}: {exc}", file=sys.stderr)


def median(values) -> float:
    return statistics.median(values)


def percentile(values, fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` 0.99 for p99)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def start_worker(
    name: str, *, pool: int, poll: float, log, extra=(), settings: str = "bench.settings"
) -> subprocess.Popen:
    """A worker process on the benchmark database, as an operator starts one:
    ``python -m django everystep_worker``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": settings}
    return subprocess.Popen(
        [sys.executable, "-m", "django", "everystep_worker", "--name", name, "--pool", str(pool),
         "--poll", str(poll), *extra],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
    )


def stop_workers(procs) -> None:
    """SIGTERM (a clean drain), then SIGKILL whatever is still there after 30 s."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def as_printed(value: float, spec: str) -> float:
    """``value`` as ``format(value, spec)`` prints it (``".0%"``, ``".2f"``): a
    figure is judged against its target as the reader sees it, so that "75%"
    next to ">= 75%" is never a MISS."""
    text = format(value, spec)
    return float(text[:-1]) / 100 if text.endswith("%") else float(text)


def table(rows, headers) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [line.format(*headers), line.format(*("-" * w for w in widths))]
    out += [line.format(*map(str, row)) for row in rows]
    return "\n".join(out)
