from tests.worker.conftest import spawn_worker  # noqa: F401  (real worker processes)
