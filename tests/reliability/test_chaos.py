"""The bounded chaos soak: real worker processes, SIGKILL, SIGTERM and a
PostgreSQL restart. The soak checks its own invariants and exits non-zero on
any violation (see bench/chaos.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.django_db]


def test_short_chaos_soak_keeps_every_promise():
    if connection.vendor != "postgresql":
        pytest.skip("the soak runs against PostgreSQL")
    settings = connection.settings_dict
    url = f"postgres://{settings['USER']}@{settings['HOST']}:{settings['PORT'] or 5432}/everystep_chaos"
    try:
        out = subprocess.run(
            [sys.executable, "bench/chaos.py", "--short", "--seed", "7"],
            cwd=ROOT, capture_output=True, text=True, timeout=600,
            env={**os.environ, "EVERYSTEP_BENCH_DATABASE_URL": url},
        )
    finally:
        connection.close()  # the soak restarted PostgreSQL under this connection
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no violations" in out.stdout
