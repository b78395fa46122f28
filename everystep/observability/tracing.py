"""OpenTelemetry traces (``everystep[otel]``), through the API only.

One span per run pass, named after the workflow; one child span per executed
step (replayed steps make none), named after the step function; one per wait
reached (``everystep.sleep``, ``everystep.wait_for_event``); one span per
``parallel`` fork, whose branch threads carry its context so their step spans
nest under it. A run span is in error only when the run ended ``failed``;
a step or fork span only for a real failure, never for ``Terminal``, a
blocked step, a drain or a fence.

The tracer comes from the global provider the project configures; without
one a run makes no span at all, and when the run was sampled out its span is
not recording, and its steps and forks then make none.
"""

import logging
import os
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from ..errors import DrainOrphan, EffectUncertain, SimulatedCrash, Suspended, Terminal

logger = logging.getLogger("everystep")

# A proxy until the project sets its provider, then that provider's tracer. Not
# trace.get_tracer(): that loads the provider OTEL_PYTHON_TRACER_PROVIDER names,
# and raises at import when it is not installed.
tracer = trace.ProxyTracer("everystep")
_provider_failed = False  # that provider did not load: tracing is off, said once

_CONTROL = (Terminal, EffectUncertain, DrainOrphan, SimulatedCrash, Suspended)
_NOT_RECORDED = "not_recorded"  # the run's end was not written (fenced, simulated crash)
# The run's span, kept in the run's context: a branch thread carries it (carry_context),
# where the current span is the fork's.
_RUN_SPAN = otel_context.create_key("everystep.run_span")


@contextmanager
def _quiet_span(name: str, attributes: dict):
    """The span, current inside the block. The API would mark any exception
    as an error; Terminal and friends are not.

    Starting and ending a span calls the project's span processors, which the
    OpenTelemetry spec says must not raise. One that does anyway is logged and
    its span given up: a step that ran stays done, its run goes on."""
    span_cm = tracer.start_as_current_span(
        name, attributes=attributes, record_exception=False, set_status_on_exception=False
    )
    try:
        span = span_cm.__enter__()
    except Exception:
        logger.warning("could not trace %s: starting its span raised", name, exc_info=True)
        yield trace.INVALID_SPAN
        return
    try:
        yield span
    except BaseException as exc:
        _end(span_cm, name, exc)
        raise
    _end(span_cm, name, None)


def _end(span_cm, name: str, exc: BaseException | None) -> None:
    try:
        span_cm.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
    except Exception as raised:
        if raised is not exc:  # the block's own exception passes on; a processor's is logged
            logger.warning("could not trace %s: ending its span raised", name, exc_info=True)


def _fail(span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def _configured() -> bool:
    """Whether the project set a tracer provider (in code, or through
    ``OTEL_PYTHON_TRACER_PROVIDER``). Until it does, the API's tracer makes
    only spans that record nothing. A provider named there that does not load
    (the API raises, StopIteration included, on every look) turns tracing off:
    the extra is optional, its failures must not stop a run."""
    global _provider_failed
    if _provider_failed:
        return False
    try:
        provider = trace.get_tracer_provider()
    except Exception:
        _provider_failed = True
        logger.warning(
            "OTEL_PYTHON_TRACER_PROVIDER=%r does not load; everystep makes no spans",
            os.environ.get("OTEL_PYTHON_TRACER_PROVIDER"),
            exc_info=True,
        )
        return False
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


@contextmanager
def run_span(run, claimer: str):
    if not _configured():
        # No span would record, nor would its steps': a run then skips the
        # span's context and attributes (a few per cent of a short run's CPU).
        yield trace.INVALID_SPAN
        return
    attributes = {
        "everystep.workflow": run.name,
        "everystep.run_id": str(run.id),
        "everystep.runner": claimer,
    }
    with _quiet_span(run.name, attributes) as span:
        token = otel_context.attach(otel_context.set_value(_RUN_SPAN, span))
        try:
            yield span
        except Exception as exc:  # an engine error outside the body
            _fail(span, exc)
            raise
        finally:
            otel_context.detach(token)


def run_ended(span, status: str | None) -> None:
    span.set_attribute("everystep.status", status or _NOT_RECORDED)


def run_failed(exc: BaseException) -> None:
    # Called while the run span is current (the runner writes the end inside it).
    _fail(trace.get_current_span(), exc)


def child_started(step_id: str, child: str, child_id) -> None:
    """An event on the run's span: the parent's trace names each child it
    started (the child's own run span carries its run id)."""
    span = otel_context.get_value(_RUN_SPAN)
    if span is not None and span.is_recording():
        attributes = {
            "everystep.step_id": step_id, "everystep.workflow": child, "everystep.run_id": str(child_id),
        }
        span.add_event("everystep.child_started", attributes)


def recording() -> bool:
    """Whether the current span records: steps and forks make spans only then."""
    return trace.get_current_span().is_recording()


@contextmanager
def _child_span(name: str, attributes: dict):
    with _quiet_span(name, attributes) as span:
        try:
            yield span
        except BaseException as exc:
            # A wait that suspends the run ends its span as "waiting": the run goes on later.
            span.set_attribute("everystep.outcome", "waiting" if isinstance(exc, Suspended) else "failed")
            if not isinstance(exc, _CONTROL):
                _fail(span, exc)
            raise
        span.set_attribute("everystep.outcome", "done")


def step_span(state, step_id: str, spec):
    attributes = {
        "everystep.step_id": step_id,
        "everystep.step": spec.name,
        "everystep.run_id": str(state.workflow_id),
    }
    return _child_span(spec.name, attributes)


def wait_span(state, step_id: str, name: str, kind: str, key: str | None):
    """A sleep or an event wait reached (not one served on replay): its outcome is
    ``done``, ``failed`` (a timeout) or ``waiting`` (the run left its worker)."""
    attributes = {
        "everystep.step_id": step_id,
        "everystep.step": name,
        "everystep.run_id": str(state.workflow_id),
        "everystep.wait_kind": kind,
    }
    if key is not None:
        attributes["everystep.event_key"] = key
    return _child_span(name, attributes)


def fork_span(state, fork_id: str):
    return _child_span(
        "parallel", {"everystep.step_id": fork_id, "everystep.run_id": str(state.workflow_id)}
    )


def carry_context(target):
    """Wrap a branch thread's target so that it runs in this thread's current
    context (contextvars do not cross into a new thread)."""
    parent = otel_context.get_current()

    def in_branch(*args):
        token = otel_context.attach(parent)
        try:
            return target(*args)
        finally:
            otel_context.detach(token)

    return in_branch
