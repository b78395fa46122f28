import pytest
from django.conf import settings

from everystep import runner
from tests.throwaway_postgres import ThrowawayPostgres


@pytest.fixture(autouse=True)
def _no_fault_hook():
    yield
    runner.fault = None


@pytest.fixture
def throwaway_postgres():
    """A running PostgreSQL server of the test's own (tests/throwaway_postgres.py),
    for tests that restart or stop one; removed at the end, also when the test fails.

    Such tests belong to the PostgreSQL pass: they skip on the others, and in the
    PostgreSQL pass missing server binaries are an error, not a skip."""
    if not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        pytest.skip("restarts a PostgreSQL server of its own: runs in the PostgreSQL pass")
    with ThrowawayPostgres() as server:
        yield server
