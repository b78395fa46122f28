"""Benchmark settings: the test settings on the database named by
``EVERYSTEP_BENCH_DATABASE_URL``, which ``bench.common.setup()`` points at the
run's own database (worker processes inherit it)."""

import os

from bench.common import DEFAULT_DATABASE_URL
from tests.settings import *  # noqa: F403
from tests.settings import database_from_url

DATABASE_URL = os.environ.get("EVERYSTEP_BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
DATABASES = {"default": database_from_url(DATABASE_URL)}
EVERYSTEP_DATABASE = "default"  # one database, whatever layout the test settings chose
DATABASE_ROUTERS = []
LOGGING = {"version": 1, "disable_existing_loggers": False}

# The chaos soak behind PgBouncer (bench/chaos.py --pgbouncer): data through
# it, prepared statements off (PgBouncer 1.18) unless --prepared, LISTEN
# straight to PostgreSQL.
if "EVERYSTEP_BENCH_PREPARED_STATEMENTS" in os.environ:
    EVERYSTEP_PREPARED_STATEMENTS = os.environ["EVERYSTEP_BENCH_PREPARED_STATEMENTS"] == "1"
if os.environ.get("EVERYSTEP_BENCH_LISTEN_DATABASE_URL"):
    DATABASES["listen"] = database_from_url(os.environ["EVERYSTEP_BENCH_LISTEN_DATABASE_URL"])
    EVERYSTEP_LISTEN_DATABASE = "listen"

# The chaos soak gives its workers short heartbeats (bench/chaos.py).
if "EVERYSTEP_BENCH_HEARTBEAT_INTERVAL" in os.environ:
    EVERYSTEP_HEARTBEAT_INTERVAL = float(os.environ["EVERYSTEP_BENCH_HEARTBEAT_INTERVAL"])
if "EVERYSTEP_BENCH_RECOVER_STALE_AFTER" in os.environ:
    EVERYSTEP_RECOVER_STALE_AFTER = float(os.environ["EVERYSTEP_BENCH_RECOVER_STALE_AFTER"])

# Django's connection pool (psycopg-pool), as the figures before December 2026
# were measured: then a worker's pool threads closed their connection after each
# run, and the pool saved the next run a new PostgreSQL connection (about 10 ms
# here). The threads keep their connection now; EVERYSTEP_BENCH_POOL=0 measures
# without the pool (a plain DATABASES setting).
if DATABASES["default"]["ENGINE"].endswith("postgresql") and os.environ.get("EVERYSTEP_BENCH_POOL") != "0":
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {"min_size": 2, "max_size": 40}
