import pytest
import sentry_sdk
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sentry_sdk.transport import Transport

from tests.core import workflows

_exporter = InMemorySpanExporter()


@pytest.fixture(autouse=True)
def _reset_effects():
    workflows.effects.clear()


@pytest.fixture(scope="session")
def _tracer_provider():
    # The global provider can be set only once per process: set ours, or add
    # our exporter to the SDK provider something else set first.
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(_exporter))


@pytest.fixture
def spans(_tracer_provider):
    """The finished spans, recorded by the real SDK."""
    _exporter.clear()
    yield _exporter
    _exporter.clear()


class CapturingTransport(Transport):
    """Keeps the events in memory instead of sending them."""

    def __init__(self, options=None):
        super().__init__(options)
        self.events = []

    def capture_envelope(self, envelope):
        event = envelope.get_event()
        if event is not None:
            self.events.append(event)


@pytest.fixture
def sentry_events():
    """Sentry initialised as a project would (default integrations), with no network."""
    transport = CapturingTransport()
    sentry_sdk.init(
        dsn="https://public@example.invalid/1",
        transport=transport,
        # Django's integration would patch Django for the rest of the test session.
        auto_enabling_integrations=False,
    )
    yield transport.events
    sentry_sdk.get_client().close()
    sentry_sdk.get_global_scope().set_client(None)
