"""Benchmark settings: the test settings on the database named by
``EVERYSTEP_BENCH_DATABASE_URL`` (default: a local PostgreSQL database
``everystep_bench``, created on first use)."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import database_from_url

DATABASE_URL = os.environ.get(
    "EVERYSTEP_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/everystep_bench"
)
DATABASES = {"default": database_from_url(DATABASE_URL)}
LOGGING = {"version": 1, "disable_existing_loggers": False}
