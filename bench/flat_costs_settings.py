"""The benchmark settings plus a second database, alias ``full``, named by
``EVERYSTEP_BENCH_FULL_DATABASE_URL``: bench/flat_costs.py points everystep at
one or the other (``EVERYSTEP_DATABASE``) to measure both side by side."""

import os

from bench.settings import *  # noqa: F403
from bench.settings import DATABASES, database_from_url

DATABASES["full"] = database_from_url(os.environ["EVERYSTEP_BENCH_FULL_DATABASE_URL"])
DATABASES["full"]["OPTIONS"] = dict(DATABASES["default"].get("OPTIONS", {}))
