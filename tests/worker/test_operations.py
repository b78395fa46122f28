"""The operator transitions and the claim functions: allowed from, refused from,
and refused when the run moved on (nothing changes then)."""

import datetime as dt
import uuid

import pytest
from django.utils import timezone

from everystep import claims, operations, serde
from everystep.errors import EverystepError, Terminal
from everystep.models import Step, Workflow
from tests.worker import workflows as w

pytestmark = pytest.mark.django_db

S = Workflow.Status
CHAIN = "tests.worker.workflows.chain"
MARK = "tests.worker.workflows.mark"
CHARGE = "tests.worker.workflows.charge"
FAIL = "tests.worker.workflows.fail"


def make_run(status=S.SCHEDULED, claimed_by=None, **fields) -> Workflow:
    if status in S.terminal_values():
        fields.setdefault("completed_at", timezone.now())
    return Workflow.objects.create(name=CHAIN, args=[], status=status, claimed_by=claimed_by, **fields)


def add_step(run, step_id, status="done", name=MARK, **fields) -> Step:
    return Step.objects.create(workflow=run, step_id=step_id, name=name, status=status, **fields)


def snapshot(run):
    row = Workflow.objects.get(id=run.id)
    steps = list(Step.objects.filter(workflow=run).values_list("step_id", "status"))
    return row.status, row.claimed_by, row.error, row.completed_at, steps


# ---------------------------------------------------------------- stop


@pytest.mark.parametrize("status", [S.SCHEDULED, S.RUNNING, S.BLOCKED])
def test_stop_from_an_allowed_status(status):
    run = make_run(status, claimed_by="w1" if status == S.RUNNING else None)
    stopped = operations.stop_run(run.id, actor="alice", expected_status=status)
    assert stopped.status == S.STOPPED
    assert stopped.completed_at is not None
    error = serde.decode_exception(stopped.error)
    assert isinstance(error, Terminal)
    assert str(error) == "stopped by an operator (alice)"


def test_stop_without_expected_status_or_actor():
    run = make_run(S.RUNNING, claimed_by="w1")
    assert operations.stop_run(str(run.id)).error["message"] == "stopped by an operator"


@pytest.mark.parametrize("status", [S.COMPLETED, S.FAILED, S.STOPPED])
def test_stop_is_refused_from_a_terminal_status(status):
    run = make_run(status)
    before = snapshot(run)
    with pytest.raises(EverystepError, match=f"is {status}: only a scheduled or running or blocked"):
        operations.stop_run(run.id)
    with pytest.raises(EverystepError, match=f"a {status} run cannot be stopped"):
        operations.stop_run(run.id, expected_status=status)
    assert snapshot(run) == before


def test_stop_is_refused_when_the_run_moved_on():
    run = make_run(S.RUNNING, claimed_by="w1")
    before = snapshot(run)
    with pytest.raises(EverystepError, match="moved on: it is running now, not scheduled"):
        operations.stop_run(run.id, expected_status=S.SCHEDULED)
    assert snapshot(run) == before


def test_operations_refuse_unknown_and_malformed_ids():
    missing = uuid.uuid4()
    for operation in (operations.stop_run, operations.retry_run, operations.requeue_run):
        with pytest.raises(EverystepError, match=f"run {missing} does not exist"):
            operation(missing)
        with pytest.raises(EverystepError, match="not a valid run id"):
            operation("nope")
    with pytest.raises(EverystepError, match="does not exist"):
        operations.retry_preview(missing)


# ---------------------------------------------------------------- retry


def test_retry_discards_from_the_first_failed_step_onward():
    run = make_run(S.FAILED, claimed_by="w1", error={"type": "x.Y", "message": "m", "args": []})
    add_step(run, "1", result=1)
    failed = add_step(run, "2", status="failed", name=FAIL, error={"type": "x", "message": "m", "args": []})
    add_step(run, "3", result=3)
    add_step(run, "4", status="started", name=CHARGE)
    add_step(run, "5", status="failed", name=FAIL)

    preview = operations.retry_preview(run.id)
    discarded = operations.retry_run(run.id, expected_status=S.FAILED)

    assert discarded == preview
    assert [(d.step_id, d.status, d.unsafe) for d in discarded] == [
        ("2", "failed", ""),
        ("3", "done", ""),
        ("4", "started", "unsafe to repeat"),
        ("5", "failed", ""),
    ]
    assert discarded[0].id == failed.id and discarded[0].name == FAIL
    row = Workflow.objects.get(id=run.id)
    assert (row.status, row.claimed_by, row.error, row.result, row.completed_at) == (
        S.SCHEDULED,
        None,
        None,
        None,
        None,
    )
    assert list(row.steps.values_list("step_id", flat=True)) == ["1"]


def test_retry_of_an_operator_stop_discards_nothing():
    run = operations.stop_run(make_run(S.RUNNING, claimed_by="w1").id)
    add_step(run, "1", result=1)
    assert operations.retry_run(run.id) == []
    assert Workflow.objects.get(id=run.id).status == S.SCHEDULED
    assert Step.objects.filter(workflow=run).count() == 1


@pytest.mark.parametrize("status", [S.SCHEDULED, S.RUNNING, S.COMPLETED, S.BLOCKED])
def test_retry_is_refused_from_other_statuses(status):
    run = make_run(status)
    add_step(run, "1", status="failed", name=FAIL)
    before = snapshot(run)
    with pytest.raises(EverystepError, match=f"is {status}: only a failed or stopped run can be retried"):
        operations.retry_run(run.id)
    with pytest.raises(EverystepError, match=f"a {status} run cannot be retried"):
        operations.retry_run(run.id, expected_status=status)
    assert snapshot(run) == before


def test_retry_is_refused_when_the_run_moved_on():
    run = make_run(S.STOPPED)
    add_step(run, "1", status="failed", name=FAIL)
    before = snapshot(run)
    with pytest.raises(EverystepError, match="moved on: it is stopped now, not failed"):
        operations.retry_run(run.id, expected_status=S.FAILED)
    assert snapshot(run) == before


# ---------------------------------------------------------------- requeue


def test_requeue_a_running_run():
    run = make_run(S.RUNNING, claimed_by="w1")
    requeued = operations.requeue_run(run.id)
    assert (requeued.status, requeued.claimed_by) == (S.SCHEDULED, None)


@pytest.mark.parametrize("status", [S.SCHEDULED, S.COMPLETED, S.FAILED, S.STOPPED, S.BLOCKED])
def test_requeue_is_refused_from_other_statuses(status):
    run = make_run(status)
    before = snapshot(run)
    with pytest.raises(EverystepError, match=f"moved on: it is {status} now, not running"):
        operations.requeue_run(run.id)
    with pytest.raises(EverystepError, match=f"is {status}: only a running run can be requeued"):
        operations.requeue_run(run.id, expected_status=None)
    with pytest.raises(EverystepError, match=f"a {status} run cannot be requeued"):
        operations.requeue_run(run.id, expected_status=status)
    assert snapshot(run) == before


def test_requeue_is_guarded_on_the_expected_claimer():
    run = make_run(S.RUNNING, claimed_by="w2")  # claimed by w2 since the operator saw w1
    before = snapshot(run)
    with pytest.raises(EverystepError, match="moved on: it is running under w2 now, not w1"):
        operations.requeue_run(run.id, expected_claimer="w1")
    with pytest.raises(EverystepError, match="claimer .* NUL character"):  # not a DataError on PostgreSQL
        operations.requeue_run(run.id, expected_claimer="w2\x00")
    assert snapshot(run) == before


def test_release_hands_back_only_a_run_still_running_under_that_claimer():
    """A worker leaving a run (drain, stale notice) must not take it from the worker
    that claimed it since, nor reopen a run that ended."""
    taken = make_run(S.RUNNING, claimed_by="w2")
    stopped = make_run(S.STOPPED, claimed_by="w1")
    before = [snapshot(taken), snapshot(stopped)]
    assert not operations.release_run(taken.id, "w1")
    assert not operations.release_run(stopped.id, "w1")
    assert [snapshot(taken), snapshot(stopped)] == before
    assert operations.release_run(taken.id, "w2")
    assert snapshot(taken)[:2] == (S.SCHEDULED, None)


def test_requeue_claimer_takes_only_that_workers_running_runs():
    mine = [make_run(S.RUNNING, claimed_by="w1") for _ in range(3)]
    other = make_run(S.RUNNING, claimed_by="w2")
    done = make_run(S.COMPLETED, claimed_by="w1")
    assert sorted(operations.requeue_claimer("w1")) == sorted(run.id for run in mine)
    assert set(Workflow.objects.filter(id__in=[r.id for r in mine]).values_list("status", "claimed_by")) == {
        (S.SCHEDULED, None)
    }
    assert Workflow.objects.get(id=other.id).status == S.RUNNING
    assert Workflow.objects.get(id=done.id).status == S.COMPLETED
    assert operations.requeue_claimer("w1") == []
    with pytest.raises(EverystepError, match="must not be empty"):
        operations.requeue_claimer(" ")


# ---------------------------------------------------------------- claiming


def test_claim_takes_the_oldest_scheduled_runs_up_to_the_limit():
    now = timezone.now()
    runs = [make_run(created_at=now - dt.timedelta(seconds=10 - i)) for i in range(5)]
    make_run(S.BLOCKED)
    make_run(S.RUNNING, claimed_by="other")
    claimed = claims.claim_runs("w1", 3)
    assert [run.id for run in claimed] == [run.id for run in runs[:3]]
    assert all(run.status == S.RUNNING and run.claimed_by == "w1" for run in claimed)
    assert claimed[0].args == [] and claimed[0].name == CHAIN
    rows = Workflow.objects.filter(id__in=[r.id for r in runs])
    assert (
        sorted(rows.values_list("status", "claimed_by"))
        == [(S.RUNNING, "w1")] * 3 + [(S.SCHEDULED, None)] * 2
    )
    assert claims.claim_runs("w1", 0) == []


def test_claim_skips_excluded_runs():
    first, second = make_run(), make_run()
    claimed = claims.claim_runs("w1", 5, exclude=[first.id])
    assert [run.id for run in claimed] == [second.id]


def test_claim_decodes_arguments():
    run = Workflow.objects.create(name=CHAIN, args=["log", 2, dt.timedelta(seconds=3)])
    [claimed] = claims.claim_runs("w1", 1)
    assert claimed.id == run.id
    assert claimed.args == ["log", 2, dt.timedelta(seconds=3)]
    assert isinstance(claimed.created_at, dt.datetime)


def test_reclaim_own_returns_parked_runs_and_requeues_the_excess():
    now = timezone.now()
    parked = [
        make_run(S.RUNNING, claimed_by="w1", created_at=now - dt.timedelta(seconds=9 - i)) for i in range(3)
    ]
    make_run(S.RUNNING, claimed_by="w2")
    reclaimed = claims.reclaim_own("w1", 2)
    assert [run.id for run in reclaimed] == [run.id for run in parked[:2]]
    assert Workflow.objects.get(id=parked[2].id).status == S.SCHEDULED
    assert Workflow.objects.filter(claimed_by="w2", status=S.RUNNING).count() == 1


# ---------------------------------------------------------------- pruning


def old_run(status, days=10, steps=2):
    run = make_run(status, completed_at=timezone.now() - dt.timedelta(days=days))
    for i in range(steps):
        add_step(run, str(i + 1))
    return run


def test_prune_deletes_old_terminal_runs_and_their_steps_in_batches():
    old = [old_run(S.COMPLETED), old_run(S.FAILED), old_run(S.STOPPED)]
    recent = old_run(S.COMPLETED, days=1)
    blocked = old_run(S.BLOCKED)
    scheduled = make_run(S.SCHEDULED)
    running = make_run(S.RUNNING, claimed_by="w1")

    assert operations.prune(older_than=dt.timedelta(days=7), dry_run=True) == 3
    assert Workflow.objects.count() == 7
    assert operations.prune(older_than=dt.timedelta(days=7), batch=2) == 3

    assert not Workflow.objects.filter(id__in=[r.id for r in old]).exists()
    assert not Step.objects.filter(workflow_id__in=[r.id for r in old]).exists()
    left = {recent.id, blocked.id, scheduled.id, running.id}
    assert set(Workflow.objects.values_list("id", flat=True)) == left
    assert Step.objects.count() == 4


def test_prune_takes_blocked_runs_only_when_named():
    old_run(S.BLOCKED)
    completed = old_run(S.COMPLETED)
    assert operations.prune(older_than=dt.timedelta(days=7), statuses=["blocked"]) == 1
    assert list(Workflow.objects.values_list("id", flat=True)) == [completed.id]


@pytest.mark.parametrize("status", [S.SCHEDULED, S.RUNNING, "bogus"])
def test_prune_refuses_non_terminal_statuses(status):
    run = old_run(S.COMPLETED)
    with pytest.raises(EverystepError, match=f"cannot prune runs in status {status}"):
        operations.prune(older_than=dt.timedelta(days=1), statuses=["completed", status])
    assert Workflow.objects.filter(id=run.id).exists()


@pytest.mark.django_db(transaction=True)
def test_the_prune_statements_use_indexes_on_a_big_table():
    """Each batch finds its runs by the completed_at index and their steps by
    the unique (workflow_id, step_id) index: a pass over a long history costs
    per run pruned, not per run kept (bench/flat_costs.py measures the rate)."""
    from django.test.utils import CaptureQueriesContext

    from everystep import database

    conn = database.connection()
    if conn.vendor != "postgresql":
        pytest.skip("the plans checked are PostgreSQL's")
    now = timezone.now()
    runs = [
        Workflow(name=CHAIN, args=[], status=S.FAILED if i % 50 == 0 else S.COMPLETED,
                 created_at=now - dt.timedelta(days=30) * (1 - i / 20_000),
                 completed_at=now - dt.timedelta(days=30) * (1 - i / 20_000))
        for i in range(20_000)
    ]
    Workflow.objects.bulk_create(runs, batch_size=2_000)
    Step.objects.bulk_create(
        (Step(workflow=run, step_id=str(s), name=MARK, status="done") for run in runs for s in (1, 2)),
        batch_size=5_000,
    )
    with conn.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE everystep_workflow")
        cursor.execute("VACUUM ANALYZE everystep_step")
    with CaptureQueriesContext(conn) as pruned:
        assert operations.prune(older_than=dt.timedelta(days=29), batch=200) == 667
    writes_and_reads = ("SELECT", "DELETE", "UPDATE")
    statements = [q["sql"] for q in pruned.captured_queries if q["sql"].startswith(writes_and_reads)]
    assert any(sql.startswith("DELETE FROM \"everystep_step\"") for sql in statements), statements
    with conn.cursor() as cursor:
        for sql in statements:
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "Seq Scan on everystep_workflow" not in plan, f"{sql}\n{plan}"
            assert "Seq Scan on everystep_step" not in plan, f"{sql}\n{plan}"


def test_prune_refuses_bad_arguments():
    with pytest.raises(EverystepError, match="batch size"):
        operations.prune(older_than=dt.timedelta(days=1), batch=0)
    with pytest.raises(EverystepError, match="negative"):
        operations.prune(older_than=dt.timedelta(days=-1))
    with pytest.raises(EverystepError, match="at most 36525 days"):
        operations.prune(older_than=dt.timedelta(days=10**6))
    with pytest.raises(EverystepError, match="at least one status"):
        operations.prune(older_than=dt.timedelta(days=1), statuses=[])


def test_preview_flags_unsafe_steps_by_the_registry_and_steps_it_cannot_find():
    assert w.charge.__everystep__.unsafe_to_repeat
    run = make_run(S.FAILED)
    add_step(run, "1", status="failed", name=FAIL)
    add_step(run, "2", status="started", name=CHARGE)
    add_step(run, "3", status="done", name="gone.module.step")
    unsafe = [d.unsafe for d in operations.retry_preview(run.id)]
    assert unsafe == ["", "unsafe to repeat", "may be unsafe to repeat (its function cannot be found here)"]
