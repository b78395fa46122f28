import pytest

from tests.core import workflows


@pytest.fixture(autouse=True)
def _reset_effects():
    workflows.effects.clear()
    yield
    workflows.effects.clear()
