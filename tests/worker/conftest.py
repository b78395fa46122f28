import contextlib
import signal
import threading

import pytest
from django.core.management import call_command
from django.db import connections
from django.db.utils import load_backend
from django.test import override_settings

from everystep.worker import Worker
from tests.settings import database_from_url
from tests.worker import workflows
from tests.worker.support import THROWAWAY, ToThrowaway, WorkerProcess, wait_for


@pytest.fixture(autouse=True)
def _reset_occupancy():
    workflows.occupancy.update(now=0, max=0)


@pytest.fixture
def spawn_worker(tmp_path):
    """Start worker subprocesses; any still alive at the end are killed (before the
    database is flushed, which would otherwise wait on their locks)."""
    started = []

    def spawn(
        name: str, *args: str, database_url: str | None = None, extra_env: dict | None = None
    ) -> WorkerProcess:
        output = tmp_path / f"worker-{name}-{len(started)}.log"
        proc = WorkerProcess(name, list(args), output, database_url=database_url, extra_env=extra_env)
        started.append(proc)
        return proc

    yield spawn
    for proc in started:
        if proc.alive():
            proc.signal(signal.SIGKILL)
        proc.wait()


@pytest.fixture
def start_worker():
    """Run a Worker on a thread (an embedded worker: no signal handlers)."""
    running = []

    def start(**options) -> Worker:
        options.setdefault("poll", 0.05)
        options.setdefault("name", "inproc")
        worker = Worker(**options)
        thread = threading.Thread(target=worker.run, name=f"worker-{worker.name}")
        thread.start()
        worker.thread = thread
        running.append(worker)
        return worker

    yield start
    for worker in running:
        worker.stop()
    # A moment's drain first: most runs are done, and a pool thread between two
    # runs lets go of its slot at once. Then the worker shuts down with nothing
    # abandoned and closes its pool threads' connections (left to the garbage
    # collector otherwise: Python 3.13 warns of each unclosed SQLite database).
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not any(worker._inflight for worker in running), timeout=1, interval=0.01)
    for worker in running:
        worker.stop()  # a second stop: do not wait out the rest of the drain
    for worker in running:
        worker.thread.join(timeout=30)
        assert not worker.thread.is_alive(), f"worker {worker.name} did not stop"
        # A forced stop returns without its pool threads. One between two runs
        # may still be claiming its slot's next run (which it puts back at the
        # run's first step boundary): wait for it to let go of its slot, or its
        # claim can take a run of the next test's.
        wait_for(lambda worker=worker: not worker._inflight, timeout=30,
                 what=f"worker {worker.name}'s pool threads to let go of their runs")


@pytest.fixture
def throwaway_database(throwaway_postgres, transactional_db):
    """A migrated database on the test's own PostgreSQL server, for tests that
    restart it; yields its URL (``spawn_worker(..., database_url=url)``). While
    the test runs, its own queries (``schedule()``, ``Workflow.objects``) go
    there too: the Django alias ``THROWAWAY``, made everystep's database
    (``EVERYSTEP_DATABASE``) and the target of every other query by a router.
    ``connections["default"]`` stays the database the suite was given."""
    url = throwaway_postgres.create_database("everystep")
    both = {"default": connections.settings["default"], THROWAWAY: database_from_url(url)}
    config = connections.configure_settings(both)[THROWAWAY]  # Django's defaults filled in
    # A connection made here, not declared in DATABASES: Django's test case
    # allows such a connection (it forbids declared aliases the test did not ask for).
    connections[THROWAWAY] = load_backend(config["ENGINE"]).DatabaseWrapper(config, THROWAWAY)
    try:
        with override_settings(DATABASE_ROUTERS=[ToThrowaway()], EVERYSTEP_DATABASE=THROWAWAY):
            call_command("migrate", database=THROWAWAY, verbosity=0)
            yield url
    finally:
        connections[THROWAWAY].close()
        del connections[THROWAWAY]
