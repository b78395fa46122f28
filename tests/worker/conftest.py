import signal
import threading

import pytest

from everystep.worker import Worker
from tests.worker import workflows
from tests.worker.support import WorkerProcess


@pytest.fixture(autouse=True)
def _reset_occupancy():
    workflows.occupancy.update(now=0, max=0)


@pytest.fixture
def spawn_worker(tmp_path):
    """Start worker subprocesses; any still alive at the end are killed (before the
    database is flushed, which would otherwise wait on their locks)."""
    started = []

    def spawn(name: str, *args: str, extra_env: dict | None = None) -> WorkerProcess:
        output = tmp_path / f"worker-{name}-{len(started)}.log"
        proc = WorkerProcess(name, list(args), output, extra_env)
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
        worker.stop()  # a second stop: do not wait out the drain
    for worker in running:
        worker.thread.join(timeout=30)
        assert not worker.thread.is_alive(), f"worker {worker.name} did not stop"
