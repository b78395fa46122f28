"""Metrics and trace spans of sleeps and event waits."""

import datetime as dt
import uuid
from unittest import mock

import pytest
from django.utils import timezone
from prometheus_client import REGISTRY

from everystep import operations, waits
from everystep.api import schedule
from everystep.models import Workflow
from everystep.worker import Worker
from tests.helpers import run_once
from tests.waits import workflows as w

pytestmark = pytest.mark.django_db(transaction=True)

NAPS = "tests.waits.workflows.naps"
AWAITS = "tests.waits.workflows.awaits"


def value(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0


def test_a_suspension_is_counted_by_workflow_kind_and_runner():
    runner = f"runner-{uuid.uuid4().hex[:8]}"
    run_once(schedule(w.naps, 3600), runner)
    run_once(schedule(w.awaits, "k", None), runner)
    assert value("everystep_runs_suspended_total", workflow=NAPS, kind="time", runner=runner) == 1
    assert value("everystep_runs_suspended_total", workflow=AWAITS, kind="event", runner=runner) == 1


@pytest.fixture
def event_sent_before_the_suspension(monkeypatch):
    """Another process sends the awaited event after the wait found none and
    before the run's suspension is written (the race ``Waiting.ready`` covers):
    the run goes straight back to ``scheduled``."""
    real = waits.stopped_at

    def stopped_at(state):
        waits.send_event(state.workflow_id, "go", "yes")
        return real(state)

    monkeypatch.setattr(waits, "stopped_at", stopped_at)


def test_a_wait_over_at_suspension_is_not_counted_as_a_requeue(event_sent_before_the_suspension):
    runner = f"runner-{uuid.uuid4().hex[:8]}"
    row = run_once(schedule(w.awaits, "go"), runner)
    assert row.status == "scheduled"  # back in the queue at once, for the replay that reads the event
    assert value("everystep_runs_requeued_total", runner=runner) == 0  # no drain, no outage


def test_a_wait_over_at_suspension_is_not_counted_as_a_suspension(event_sent_before_the_suspension):
    runner = f"runner-{uuid.uuid4().hex[:8]}"
    row = run_once(schedule(w.awaits, "go"), runner)
    assert row.status == "scheduled"
    # It never left its worker as waiting.
    assert value("everystep_runs_suspended_total", workflow=AWAITS, kind="event", runner=runner) == 0


def test_an_event_is_counted_once_its_send_commits():
    from django.db import transaction

    from everystep import database

    before = value("everystep_events_sent_total", workflow=AWAITS)
    run = run_once(schedule(w.awaits, "k", None))
    with pytest.raises(RuntimeError), transaction.atomic(using=database.alias()):
        waits.send_event(run.id, "k", 1)
        raise RuntimeError("rolled back")
    assert value("everystep_events_sent_total", workflow=AWAITS) == before
    waits.send_event(run.id, "k", 1)
    waits.send_event(run.id, "k", 2)  # a repeated key stores nothing
    assert value("everystep_events_sent_total", workflow=AWAITS) == before + 1


def test_the_worker_counts_the_runs_it_woke():
    name = f"worker-{uuid.uuid4().hex[:8]}"
    run = run_once(schedule(w.naps, 0.2))
    due = Workflow.objects.get(id=run.id)
    assert due.status == "waiting"
    worker = Worker(name=name, poll=0.05, install_signals=False)
    worker._next_wake = 0.0
    later = timezone.now() + dt.timedelta(seconds=5)
    with mock.patch.object(waits.timezone, "now", return_value=later):
        worker._wake_due()
    assert Workflow.objects.get(id=run.id).status == "scheduled"
    assert value("everystep_runs_woken_total", runner=name) == 1


def test_a_wait_reached_makes_a_span_that_says_how_it_ended(spans):
    run = run_once(schedule(w.awaits, "k", None))
    suspended = [s for s in spans.get_finished_spans() if s.name == waits.WAIT_FOR_EVENT]
    assert len(suspended) == 1
    attributes = suspended[0].attributes
    assert attributes["everystep.outcome"] == "waiting"
    assert (attributes["everystep.wait_kind"], attributes["everystep.event_key"]) == ("event", "k")
    assert suspended[0].status.is_ok
    [run_span] = [s for s in spans.get_finished_spans() if s.parent is None]
    assert run_span.attributes["everystep.status"] == "waiting"
    spans.clear()
    waits.send_event(run.id, "k", 1)
    run_once(Workflow.objects.get(id=run.id))
    [resumed] = [s for s in spans.get_finished_spans() if s.name == waits.WAIT_FOR_EVENT]
    assert resumed.attributes["everystep.outcome"] == "done"


def test_a_wait_served_on_replay_makes_no_span(spans):
    run = run_once(schedule(w.naps_twice, 3600))
    operations.wake_now(run.id)
    spans.clear()
    run_once(Workflow.objects.get(id=run.id))
    names = [s.name for s in spans.get_finished_spans() if s.parent is not None]
    assert names.count(waits.SLEEP) == 1  # the second sleep only: the first was served
