import textwrap
from collections import Counter

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext, StatusCode, TraceFlags

from everystep.models import Step
from tests.core import workflows as w
from tests.helpers import run_workflow
from tests.observability import support
from tests.observability.workflows import nested_fork

pytestmark = pytest.mark.django_db(transaction=True)

RECORD = "tests.core.workflows.record"


def finished(spans):
    """The run span and the others of the last run, each other span keyed by its step id."""
    done = spans.get_finished_spans()
    [run] = [s for s in done if s.parent is None]
    assert all(s.context.trace_id == run.context.trace_id for s in done)
    return run, {s.attributes["everystep.step_id"]: s for s in done if s.parent is not None}


def parent_of(span, by_id):
    return by_id[span.parent.span_id]


def test_one_run_span_with_a_child_span_per_executed_step(spans):
    row = run_workflow(w.three_steps, claimer="worker-t")
    run, children = finished(spans)
    assert run.name == w.three_steps.__everystep__.name
    assert run.attributes["everystep.run_id"] == str(row.id)
    assert run.attributes["everystep.status"] == "completed"
    assert run.attributes["everystep.runner"] == "worker-t"
    assert run.status.status_code == StatusCode.UNSET
    assert sorted(children) == ["1", "2", "3"]
    for step in children.values():
        assert step.name == RECORD
        assert step.parent.span_id == run.context.span_id
        assert step.attributes["everystep.outcome"] == "done"
        assert step.attributes["everystep.run_id"] == str(row.id)


def test_replayed_steps_make_no_span(spans):
    row = run_workflow(w.three_steps, leave_check=support.drain_after(1))
    run, children = finished(spans)
    assert run.attributes["everystep.status"] == "scheduled" and sorted(children) == ["1"]
    spans.clear()
    support.resume(row)
    run, children = finished(spans)
    assert run.attributes["everystep.status"] == "completed"
    assert sorted(children) == ["2", "3"]


def test_a_failed_run_span_is_in_error(spans):
    row = run_workflow(w.failing)
    run, children = finished(spans)
    assert run.attributes["everystep.status"] == "failed"
    assert run.status.status_code == StatusCode.ERROR
    assert [e.name for e in run.events] == ["exception"]
    assert run.events[0].attributes["exception.type"] == "ValueError"
    assert children["2"].status.status_code == StatusCode.ERROR
    assert children["2"].attributes["everystep.outcome"] == "failed"
    assert children["1"].status.status_code == StatusCode.UNSET
    assert str(row.id) == run.attributes["everystep.run_id"]


def test_a_failed_step_the_body_handles_leaves_the_run_span_ok(spans):
    run_workflow(w.cleanup_on_failure)
    run, children = finished(spans)
    assert run.status.status_code == StatusCode.UNSET
    assert children["2"].status.status_code == StatusCode.ERROR


def test_stopped_and_blocked_runs_are_not_errors(spans):
    run_workflow(w.terminal_then_more)
    run, children = finished(spans)
    assert run.attributes["everystep.status"] == "stopped"
    assert run.status.status_code == StatusCode.UNSET
    assert children["2"].attributes["everystep.outcome"] == "failed"  # recorded failed...
    assert children["2"].status.status_code == StatusCode.UNSET  # ...but Terminal is no error
    spans.clear()
    support.blocked_run()
    run, children = finished(spans)
    assert run.attributes["everystep.status"] == "blocked"
    assert run.status.status_code == StatusCode.UNSET
    assert children == {}  # the uncertain step did not run


def test_a_crashed_pass_ends_its_span_without_a_status(spans):
    support.crash_at("2")
    run_workflow(w.three_steps)
    run, _ = finished(spans)
    assert run.attributes["everystep.status"] == "not_recorded"
    assert run.status.status_code == StatusCode.UNSET


def test_branch_steps_nest_under_their_fork_span_across_threads(spans):
    run_workflow(w.forked)
    run, children = finished(spans)
    by_id = {s.context.span_id: s for s in spans.get_finished_spans()}
    assert sorted(children) == ["1", "2", "2.0.1", "2.1.1", "fan", "fan.0.1", "fan.0.2"]
    for fork in ("2", "fan"):
        assert children[fork].name == "parallel"
        assert parent_of(children[fork], by_id) is run
    for step in ("2.0.1", "2.1.1"):
        assert parent_of(children[step], by_id) is children["2"]
    for step in ("fan.0.1", "fan.0.2"):  # a sequence branch: one thread, two steps
        assert parent_of(children[step], by_id) is children["fan"]
    assert parent_of(children["1"], by_id) is run


def test_nested_forks_nest_their_spans(spans):
    run_workflow(nested_fork)
    run, children = finished(spans)
    by_id = {s.context.span_id: s for s in spans.get_finished_spans()}
    assert parent_of(children["1.0.1.0.1"], by_id) is children["1.0.1"]
    assert parent_of(children["1.0.1"], by_id) is children["1"]
    assert parent_of(children["1.1.1"], by_id) is children["1"]
    assert parent_of(children["1"], by_id) is run


def test_a_failing_branch_puts_its_fork_span_in_error(spans):
    run_workflow(w.two_branch_failures)
    run, children = finished(spans)
    assert children["1"].status.status_code == StatusCode.ERROR
    assert run.status.status_code == StatusCode.UNSET  # the body caught the group


def test_a_sampled_out_run_makes_no_span_at_all(spans):
    parent = SpanContext(trace_id=1, span_id=1, is_remote=True, trace_flags=TraceFlags(0))
    with trace.use_span(NonRecordingSpan(parent)):
        assert run_workflow(w.forked).status == "completed"
    assert spans.get_finished_spans() == ()


def test_without_a_tracer_provider_a_run_starts_no_span(spans, monkeypatch):
    # As in a project that has the API installed (often pulled in by another
    # package) but configures no provider: the run makes no span, not even a
    # non-recording one, so it pays nothing for tracing but the check.
    from everystep.observability import tracing

    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    started = []
    monkeypatch.setattr(tracing.tracer, "start_as_current_span", lambda *a, **k: started.append(a))
    assert run_workflow(w.forked).status == "completed"
    assert run_workflow(w.failing).status == "failed"
    assert started == []
    assert spans.get_finished_spans() == ()


MISCONFIGURED = textwrap.dedent(
    """
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)

    from tests.core import workflows as w
    from tests.helpers import run_workflow

    assert run_workflow(w.three_steps).status == "completed"
    assert run_workflow(w.forked).status == "completed"
    print("ok")
    """
)


def test_a_tracer_provider_that_does_not_load_turns_tracing_off(tmp_path):
    # The API installed and OTEL_PYTHON_TRACER_PROVIDER naming a provider that is
    # not (the SDK's, in an image without it): everystep loads, runs work, and
    # says once why it makes no spans. A fresh process: the provider is set once per process.
    done = support.run_script(
        MISCONFIGURED, tmp_path, OTEL_PYTHON_TRACER_PROVIDER="sdk_tracer_provider_not_installed"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
    assert done.stderr.count("everystep makes no spans") == 1


class _Raising(SpanProcessor):
    """A span processor that raises where it is told to (the spec says a
    processor must not; a buggy one in a project still must not change a run)."""

    at: set = set()

    def on_start(self, span, parent_context=None):
        if "start" in self.at and span.name == RECORD:
            raise RuntimeError("processor failed on start")

    def on_end(self, span):
        if "end" in self.at and span.name in (RECORD, w.three_steps.__everystep__.name):
            raise RuntimeError("processor failed on end")


@pytest.fixture
def raising_processor(_tracer_provider):
    processor = _Raising()
    trace.get_tracer_provider().add_span_processor(processor)
    yield processor
    processor.at = set()


@pytest.mark.parametrize("where", [{"start"}, {"end"}, {"start", "end"}])
def test_a_span_processor_that_raises_changes_nothing_the_run_does(spans, raising_processor, where, caplog):
    raising_processor.at = where
    row = run_workflow(w.three_steps)
    assert (row.status, row.result) == ("completed", ["a", "b", "c"])
    steps = Step.objects.filter(workflow_id=row.id).order_by("id")
    assert list(steps.values_list("step_id", "status")) == [("1", "done"), ("2", "done"), ("3", "done")]
    assert w.effects == Counter(["a", "b", "c"])
    assert "could not trace" in caplog.text and "processor failed on" in caplog.text
