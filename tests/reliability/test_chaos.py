"""The bounded chaos soak: real worker processes, SIGKILL, SIGTERM and a
PostgreSQL restart, of a server the soak starts for itself (the one the suite
was given is not touched), then a worker SIGKILLed for good, whose runs the
others must recover within EVERYSTEP_RECOVER_STALE_AFTER plus one poll. The
soak checks its own invariants and exits non-zero on any violation (see
bench/chaos.py). The other soaks run the workers behind a PgBouncer of their own
(transaction pooling), killed and restarted once: with prepared statements off,
as PgBouncer 1.18 needs, and on, through one that keeps them (1.21 or later)."""

import re

import pytest
from django.conf import settings

from tests.scripts import run_script
from tests.throwaway_pgbouncer import pgbouncer_or_skip

pytestmark = [pytest.mark.slow]


def test_short_chaos_soak_keeps_every_promise():
    if not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        pytest.skip("the soak runs in the PostgreSQL pass")
    out = run_script("bench/chaos.py", "--short", "--seed", "7", timeout=600)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no violations" in out.stdout
    assert re.search(r"dead worker chaos-\d: SIGKILLed holding [1-9]\d* runs, never restarted", out.stdout)


@pytest.mark.parametrize("prepared", [False, True], ids=["unprepared", "prepared"])
def test_short_chaos_soak_behind_pgbouncer_keeps_every_promise(prepared):
    if not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        pytest.skip("the soak runs in the PostgreSQL pass")
    pgbouncer_or_skip(prepared)
    flags = ["--pgbouncer", "--prepared"] if prepared else ["--pgbouncer"]
    out = run_script("bench/chaos.py", "--short", "--seed", "7", *flags, timeout=600)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no violations" in out.stdout
    assert f"prepared statements {'on' if prepared else 'off'}" in out.stdout
    restarted = r"PgBouncer: killed and restarted 1 time\(s\); the workers logged [1-9]\d* reconnect"
    assert re.search(restarted, out.stdout)
