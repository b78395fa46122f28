import pytest
from django.conf import settings

from everystep import runner
from tests.scratch import cron_workflow, scratch_modules  # noqa: F401  (fixtures for every test package)
from tests.throwaway_pgbouncer import PgBouncerUnavailable, ThrowawayPgBouncer, skip_or_fail
from tests.throwaway_postgres import ThrowawayPostgres

DB_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences", "live_server"}


@pytest.fixture(autouse=True)
def _no_fault_hook():
    yield
    runner.fault = None


def pytest_collection_modifyitems(items):
    """With everystep's tables in a database of their own (EVERYSTEP_TEST_SPLIT),
    every test that uses a database may use both."""
    if len(settings.DATABASES) == 1:
        return
    for item in items:
        marker = item.get_closest_marker("django_db")
        if marker is None and not DB_FIXTURES & set(item.fixturenames):
            continue
        args, kwargs = (marker.args, marker.kwargs) if marker else ((), {})
        item.add_marker(pytest.mark.django_db(*args, **{**kwargs, "databases": "__all__"}), append=False)


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



@pytest.fixture
def start_pgbouncer():
    """``start_pgbouncer(pool_size=2, prepared_statements=False)``: a PgBouncer of the
    test's own in transaction pooling (tests/throwaway_pgbouncer.py), in front of
    the PostgreSQL server that holds everystep's test database; stopped at the
    end, also when the test fails. ``prepared_statements``: one that keeps them
    (1.21 or later), else one that does not.

    PostgreSQL pass only; without a ``pgbouncer`` to run, see :func:`skip_or_fail`."""
    from everystep import database

    if not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        pytest.skip("PgBouncer pools PostgreSQL connections: runs in the PostgreSQL pass")
    target = settings.DATABASES[database.alias()]
    started = []

    def start(pool_size: int = 2, prepared_statements: bool = False) -> ThrowawayPgBouncer:
        try:
            bouncer = ThrowawayPgBouncer(
                target["HOST"], target["PORT"], pool_size=pool_size, prepared_statements=prepared_statements
            )
        except PgBouncerUnavailable as exc:
            skip_or_fail(exc)
        started.append(bouncer)
        return bouncer.start()

    yield start
    for bouncer in started:
        bouncer.stop()
