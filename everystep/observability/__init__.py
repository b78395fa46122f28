"""Optional observability: Prometheus metrics, Sentry reports, OpenTelemetry traces.

Each integration loads only when its package is importable (the extras
``everystep[metrics]``, ``everystep[sentry]``, ``everystep[otel]``); with none
of them, ``observer`` is ``None``, nothing third-party is imported and the
runner pays one ``is None`` check per executed step.

The runner calls the :class:`Observer` at three places: around a run
(``run``), around an executed step's function (``step``; replayed steps never
reach it) and around a ``parallel`` fork (``fork``); and once when a run's
``failed`` status was written (``run_failed``). The worker calls the
module-level ``worker_*`` functions below, which are no-ops without the
metrics extra. A hook never changes what the run does.
"""

import importlib
import logging
import time
from contextlib import contextmanager

from ..errors import EverystepError

logger = logging.getLogger("everystep")


def _load(package: str, module: str):
    """Our integration module when its third-party package imports, else None.
    Only the package's own ImportError is swallowed, so a bug in ours still shows."""
    try:
        importlib.import_module(package)
    except ImportError:
        return None
    return importlib.import_module(f"{__name__}.{module}")


metrics = _load("prometheus_client", "metrics")
sentry = _load("sentry_sdk", "sentry")
tracing = _load("opentelemetry.trace", "tracing")


class Observer:
    """Dispatches the runner's hooks to the integrations that loaded."""

    def __init__(self, *, metrics=None, sentry=None, tracing=None):
        self.metrics, self.sentry, self.tracing = metrics, sentry, tracing

    def run(self, run, claimer: str, replay, *args):
        """Call ``replay(run, claimer, *args)`` (it returns the status written, or
        None) inside the run's span, and count how it ended."""
        started = time.perf_counter()
        if self.tracing is None:
            status = replay(run, claimer, *args)
        else:
            with self.tracing.run_span(run, claimer) as span:
                status = replay(run, claimer, *args)
                self.tracing.run_ended(span, status)
        if self.metrics is not None:
            self.metrics.run_ended(run.name, status, claimer, time.perf_counter() - started)
        return status

    def step(self, state, step_id: str, spec, args: tuple, kwargs: dict):
        """Call the step's function, in its span, timing it."""
        started = time.perf_counter()
        outcome = "failed"
        try:
            if self.tracing is None or not self.tracing.recording():
                result = spec.func(*args, **kwargs)
            else:
                with self.tracing.step_span(state, step_id, spec):
                    result = spec.func(*args, **kwargs)
            outcome = "done"
            return result
        finally:
            if self.metrics is not None:
                self.metrics.step_executed(
                    state.name, spec.name, outcome, state.claimer, time.perf_counter() - started
                )

    @contextmanager
    def fork(self, state, fork_id: str):
        """Around a fork; yields a wrapper for the branch threads' target (or None)."""
        if self.tracing is None:
            yield None
        elif not self.tracing.recording():
            yield self.tracing.carry_context  # no span, but the branches keep the context
        else:
            with self.tracing.fork_span(state, fork_id):
                yield self.tracing.carry_context

    def run_failed(self, run, claimer: str, exc: BaseException) -> None:
        """The run's ``failed`` status was just written (so this is called once per failure)."""
        try:
            if self.tracing is not None:
                self.tracing.run_failed(exc)
            if self.sentry is not None:
                self.sentry.report_failure(run, claimer, exc)
        except Exception:
            # Reporting must never turn a recorded failure into an engine error.
            logger.warning("run %s: could not report its failure", run.id, exc_info=True)


observer: Observer | None = (
    Observer(metrics=metrics, sentry=sentry, tracing=tracing)
    if metrics or sentry or tracing
    else None
)


# ---------------------------------------------------------------- for the worker
# No-ops without the metrics extra, so the worker calls them unconditionally.


def worker_started(name: str, pool_size: int) -> None:
    if metrics is not None:
        metrics.worker_started(name, pool_size)


def claimed(name: str, n: int) -> None:
    if metrics is not None and n:
        metrics.claimed(name, n)


def requeued(name: str, n: int) -> None:
    if metrics is not None and n:
        metrics.requeued(name, n)


def in_flight(name: str, delta: int) -> None:
    if metrics is not None:
        metrics.in_flight(name, delta)


def reconnected(name: str) -> None:
    if metrics is not None:
        metrics.reconnected(name)


def heartbeat(name: str) -> None:
    if metrics is not None:
        metrics.heartbeat(name)


def recovered(name: str, n: int) -> None:
    if metrics is not None and n:
        metrics.recovered(name, n)


def suspended(workflow: str, kind: str, runner: str) -> None:
    """A run left its worker as ``waiting`` at a wait of ``kind``."""
    if metrics is not None:
        metrics.suspended(workflow, kind, runner)


def event_sent(workflow: str) -> None:
    """``send_event`` stored an event for a run of ``workflow`` (called on commit)."""
    if metrics is not None:
        metrics.event_sent(workflow)


def woken(name: str, n: int) -> None:
    """The worker woke ``n`` waiting runs whose wake time came."""
    if metrics is not None and n:
        metrics.woken(name, n)


def child_started(workflow: str, child: str, runner: str, step_id: str, child_id) -> None:
    """A run of ``workflow`` started a run of ``child`` at ``step_id``
    (``start_child`` inserted it: a replay that finds it again does not count)."""
    if metrics is not None:
        metrics.child_started(workflow, child, runner)
    if tracing is not None:
        tracing.child_started(step_id, child, child_id)


def cron_started(workflow: str, runner: str, late: float, skipped: int) -> None:
    """This worker's insert won a cron slot, ``late`` seconds after the slot's
    time, skipping ``skipped`` missed slots before it (the catch-up policy)."""
    if metrics is not None:
        metrics.cron_started(workflow, runner, late, skipped)


def serve_worker_metrics(port: int, bind: str = "0.0.0.0"):
    """Serve this process's metrics over HTTP on a daemon thread (``--metrics-port``).

    Returns prometheus_client's ``(server, thread)``; ``server.shutdown()`` stops it.
    """
    if metrics is None:
        raise EverystepError(
            "serving worker metrics needs prometheus-client: pip install 'everystep[metrics]'"
        )
    return metrics.serve_worker_metrics(port, bind)
