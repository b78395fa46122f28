"""Shared by the benchmarks: Django set-up on a fresh PostgreSQL database, worker
processes, medians and tables."""

import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGDIR = Path(tempfile.gettempdir()) / "everystep-bench-logs"  # worker logs of the last run
LOGDIR.mkdir(exist_ok=True)


def setup(fresh: bool = True) -> None:
    """Create (or empty) the benchmark database, migrate it, and load Django."""
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django
    import psycopg
    from django.conf import settings

    db = settings.DATABASES["default"]
    admin = psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"],
                            dbname="postgres", autocommit=True)
    exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]).fetchone()
    if fresh and exists:
        admin.execute(f'DROP DATABASE "{db["NAME"]}" WITH (FORCE)')
        exists = None
    if not exists:
        admin.execute(f'CREATE DATABASE "{db["NAME"]}"')
    admin.close()
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def median(values) -> float:
    return statistics.median(values)


def percentile(values, fraction: float) -> float:
    """The nearest-rank percentile (``fraction`` 0.99 for p99)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def start_worker(name: str, *, pool: int, poll: float, log, extra=()) -> subprocess.Popen:
    """A worker process on the benchmark database, as an operator starts one:
    ``python -m django everystep_worker``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "bench.settings"}
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


def table(rows, headers) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [line.format(*headers), line.format(*("-" * w for w in widths))]
    out += [line.format(*map(str, row)) for row in rows]
    return "\n".join(out)
