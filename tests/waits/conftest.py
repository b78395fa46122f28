import pytest

from tests.waits import workflows
from tests.worker.conftest import spawn_worker, start_worker  # noqa: F401  (real workers)


@pytest.fixture(autouse=True)
def _reset_effects():
    workflows.effects.clear()
    yield
    workflows.effects.clear()
