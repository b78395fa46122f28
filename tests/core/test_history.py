"""Re-running a run from a step (in place) and forking it from a step: which
rows are discarded or copied, what the resumed run and the fork then run again
(and only that), the refusals that change nothing, and races with real
concurrent transactions."""

import datetime as dt
import threading
import uuid
from collections import Counter

import pytest
from django.db import connections

from everystep import database, history, operations, schedule
from everystep.errors import EverystepError
from everystep.models import RunFork, Step, Workflow
from tests.core import history_workflows as h
from tests.core import workflows as w
from tests.helpers import run_once, run_workflow
from tests.worker.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ORDERED = "tests.core.history_workflows.ordered"
CHARGE = "tests.core.workflows.charge"
BRANCH_0 = "after parallel fan, which holds the chosen step"


@pytest.fixture(autouse=True)
def _fresh_events():
    h.reset()
    yield
    h.reset()


def rows(run) -> list[tuple]:
    """(step id, status, result) in recording order."""
    steps = Step.objects.filter(workflow_id=run.pk).order_by("id")
    return list(steps.values_list("step_id", "status", "result"))


def payloads(run) -> dict:
    return {
        row["step_id"]: row
        for row in Step.objects.filter(workflow_id=run.pk).values(
            "step_id", "name", "status", "args", "kwargs", "result", "error"
        )
    }


def snapshot(run):
    row = Workflow.objects.get(pk=run.pk)
    steps = Step.objects.filter(workflow_id=run.pk).order_by("id")
    steps = list(steps.values_list("id", "step_id", "status"))
    return row.status, row.result, row.error, row.completed_at, row.claimed_by, steps


def completed_interleaved():
    run = run_workflow(h.interleaved, 5)
    assert run.status == "completed", run.error
    order = [step_id for step_id, _, _ in rows(run)]
    # The fixed part of the interleaving (see history_workflows).
    fixed = [("fan.0.1", "fan.1.1"), ("fan.1.1", "fan.0.2"), ("fan.0.2", "fan.1.3"), ("fan.1.3", "fan.1.4")]
    for earlier, later in fixed:
        assert order.index(earlier) < order.index(later), order
    assert order[-2:] == ["3", "4"] and order[0] == "1"
    w.effects.clear()
    return run


# ---------------------------------------------------------------- what "after" means


def test_the_cut_keeps_a_branch_running_alongside_and_discards_what_depends_on_the_step():
    run = completed_interleaved()
    cut = history.rerun_preview(run.pk, "fan.0.2")

    assert [(row.step_id, row.why, row.unsafe) for row in cut.discarded] == [
        ("fan.0.2", "the chosen step", ""),
        ("fan.0.3", "later in branch fan.0", ""),
        ("3", BRANCH_0, "unsafe to repeat"),
        ("4", BRANCH_0, ""),
    ]
    assert cut.step.step_id == "fan.0.2" and cut.step.status == "done"
    alongside = {row.step_id: row.why for row in cut.alongside}
    assert {"fan.1.3", "fan.1.4"} <= set(alongside) <= {"fan.1.2", "fan.1.3", "fan.1.4"}
    assert set(alongside.values()) == {"branch fan.1 runs alongside branch fan.0: kept"}
    by_id = dict(Step.objects.filter(workflow=run).values_list("id", "step_id"))
    kept = sorted(by_id[pk] for pk in cut.kept)
    assert kept == ["1", "fan.0.1", "fan.1.1", "fan.1.2", "fan.1.3", "fan.1.4"]
    assert list(cut.kept) == sorted(cut.kept)
    assert [row.step_id for row in cut.unsafe] == ["3"]
    assert cut.uncertain == ()
    assert cut.mark == f"10:{max(by_id)}"
    # A preview changes nothing.
    assert len(rows(run)) == 10


def test_the_cut_in_the_other_branch_and_at_the_top():
    run = completed_interleaved()
    cut = history.rerun_preview(run.pk, "fan.1.3")
    assert [(row.step_id, row.why) for row in cut.discarded] == [
        ("fan.1.3", "the chosen step"),
        ("fan.1.4", "later in branch fan.1"),
        ("3", "after parallel fan, which holds the chosen step"),
        ("4", "after parallel fan, which holds the chosen step"),
    ]
    assert [row.step_id for row in cut.unsafe] == ["fan.1.4", "3"]
    top = history.rerun_preview(run.pk, "1")
    assert [row.step_id for row in top.discarded] == [step_id for step_id, _, _ in rows(run)]
    assert top.discarded[1].why == "later in the workflow body"
    assert top.kept == () and top.alongside == ()


def test_nested_forks_part_at_the_innermost_branch():
    run = Workflow.objects.create(name="tests.core.workflows.nested_forks", status="completed")
    for step_id in ["1.0.1.0.1", "1.0.1.1.1", "1.0.1.0.2", "1.1.1", "1.0.2", "2"]:
        Step.objects.create(workflow=run, step_id=step_id, name=ORDERED, status="done")
    cut = history.rerun_preview(run.pk, "1.0.1.0.2")
    assert [(row.step_id, row.why) for row in cut.discarded] == [
        ("1.0.1.0.2", "the chosen step"),
        ("1.0.2", "after parallel 1.0.1, which holds the chosen step"),
        ("2", "after parallel 1, which holds the chosen step"),
    ]
    assert [(row.step_id, row.why) for row in cut.alongside] == [
        ("1.1.1", "branch 1.1 runs alongside branch 1.0: kept"),
    ]
    assert len(cut.kept) == 3  # 1.0.1.0.1, 1.0.1.1.1 (before it) and 1.1.1


# ---------------------------------------------------------------- re-run: what runs again


def test_rerun_from_a_branch_step_runs_again_exactly_the_rows_it_discarded():
    run = completed_interleaved()
    before = payloads(run)
    cut = history.rerun_from_step(run.pk, "fan.0.2", expected_status="completed", confirm_unsafe=True)

    row = Workflow.objects.get(pk=run.pk)
    assert (row.status, row.result, row.error, row.completed_at, row.claimed_by) == (
        "scheduled", None, None, None, None,
    )
    assert sorted(step_id for step_id, _, _ in rows(run)) == sorted(
        ["1", "fan.0.1", "fan.1.1", "fan.1.2", "fan.1.3", "fan.1.4"]
    )
    row = run_once(run)
    assert (row.status, row.result) == ("completed", "end")
    # The discarded steps ran again, once each; the kept ones (the unsafe charge
    # of branch fan.1 among them) were served.
    assert w.effects == Counter({"a2": 1, "a3": 1, "charge:50": 1, "end": 1})
    assert payloads(run) == before
    order = [step_id for step_id, _, _ in rows(run)]
    assert order[-4:] == [row.step_id for row in cut.discarded]  # recorded anew, after the rows kept


def test_rerun_from_the_first_step_runs_the_whole_body_again():
    run = completed_interleaved()
    history.rerun_from_step(run.pk, "1", confirm_unsafe=True)
    assert rows(run) == []
    assert run_once(run).status == "completed"
    everything = ["top", "a1", "a2", "a3", "b1", "bx", "b2", "charge:5", "charge:50", "end"]
    assert w.effects == Counter(everything)


def test_rerun_of_a_sequence_needs_no_confirmation_without_unsafe_steps():
    run = run_workflow(w.three_steps)
    w.effects.clear()
    cut = history.rerun_from_step(run.pk, "2")
    assert [row.step_id for row in cut.discarded] == ["2", "3"]
    assert run_once(run).result == ["a", "b", "c"]
    assert w.effects == Counter({"b": 1, "c": 1})


def test_rerun_a_failed_run_from_its_failed_step_or_from_before_it():
    run = run_workflow(h.syncs, "k1")
    assert run.status == "failed" and run.error["message"] == "timed out for k1"
    history.rerun_from_step(run.pk, "2", expected_status="failed")
    row = run_once(run)
    assert (row.status, row.result) == ("completed", "notify")
    assert h.attempts == {"k1": 2}

    other = run_workflow(h.syncs, "k2")
    w.effects.clear()
    history.rerun_from_step(other.pk, "1", expected_status="failed")
    assert run_once(other).status == "completed"
    assert w.effects == Counter({"fetch": 1, "flaky:k2": 1, "notify": 1})


def test_rerun_a_stopped_run_replays_into_the_same_stop():
    run = run_workflow(w.terminal_then_more)
    assert run.status == "stopped"
    w.effects.clear()
    history.rerun_from_step(run.pk, "2", expected_status="stopped")
    row = run_once(run)
    assert row.status == "stopped" and "customer cancelled" in row.error["message"]
    assert w.effects == Counter({"stop_here": 1})
    assert [step_id for step_id, _, _ in rows(run)] == ["1", "2"]


def test_a_kept_started_row_blocks_the_resumed_run_there():
    """An operator stopped the run while the unsafe charge of branch 1.0 was
    in flight: re-running a step of branch 1.1 keeps the uncertain charge."""
    run = stopped_with_a_charge_in_flight()
    cut = history.rerun_preview(run.pk, "1.1.2")
    assert [(row.step_id, row.status) for row in cut.uncertain] == [("1.0.1", "started")]
    assert cut.unsafe == ()
    history.rerun_from_step(run.pk, "1.1.2")
    row = run_once(run)
    assert row.status == "blocked"
    assert "unsafe-to-repeat step 1.0.1" in row.error["message"]
    assert w.effects["charge:7"] == 0 and set(w.effects) <= {"b2"}  # b2 may run before the block
    operations.resolve_step(run.pk, "1.0.1", result={"charged": 7})
    assert run_once(run).status == "completed"
    assert w.effects["charge:7"] == 0


def stopped_with_a_charge_in_flight() -> Workflow:
    run = Workflow.objects.create(
        name="tests.core.history_workflows.charge_alongside", args=[7], status="stopped",
        error={"type": "everystep.api.Terminal", "message": "stopped by an operator", "args": []},
    )
    Step.objects.create(workflow=run, step_id="1.0.1", name=CHARGE, args=[7], status="started")
    Step.objects.create(workflow=run, step_id="1.1.1", name=ORDERED, args=["b1"], status="done", result="b1")
    Step.objects.create(workflow=run, step_id="1.1.2", name=ORDERED, args=["b2"], status="done", result="b2")
    return run


# ---------------------------------------------------------------- re-run: refusals change nothing


def test_unsafe_steps_that_would_run_again_need_a_confirmation_naming_them():
    run = completed_interleaved()
    before = snapshot(run)
    with pytest.raises(EverystepError) as refused:
        history.rerun_from_step(run.pk, "fan.1.3")
    assert str(refused.value) == (
        f"run {run.pk}: re-running from step fan.1.3 runs again 2 unsafe-to-repeat steps whose effect "
        f"already happened or may have: fan.1.4 ({CHARGE}), 3 ({CHARGE}). Nothing was changed; confirm "
        "that these effects may happen again to go ahead."
    )
    assert snapshot(run) == before


def test_a_step_whose_function_cannot_be_found_here_needs_the_same_confirmation():
    """Its module fails to import in this process, or it was renamed or moved:
    nothing says it is safe to repeat, so cutting before it is confirmed as
    for an unsafe step (the engine's own rows, such as a wait's, are not)."""
    run = run_workflow(w.three_steps)
    Step.objects.filter(workflow=run, step_id="3").update(name="gone.module.charge")
    before = snapshot(run)
    unknown = "may be unsafe to repeat (its function cannot be found here)"
    assert [row.unsafe for row in history.rerun_preview(run.pk, "2").unsafe] == [unknown]
    for cut_at, doing in ((history.rerun_from_step, "re-running"), (history.fork_from_step, "forking")):
        with pytest.raises(EverystepError) as refused:
            cut_at(run.pk, "2")
        assert str(refused.value) == (
            f"run {run.pk}: {doing} from step 2 runs again 1 unsafe-to-repeat step whose effect already "
            f"happened or may have: 3 (gone.module.charge, {unknown}). Nothing was changed; confirm "
            "that these effects may happen again to go ahead."
        )
    assert snapshot(run) == before and not RunFork.objects.exists()

    cut = history.rerun_from_step(run.pk, "2", confirm_unsafe=True)
    assert [row.step_id for row in cut.discarded] == ["2", "3"]
    assert Workflow.objects.get(pk=run.pk).status == "scheduled"


@pytest.mark.parametrize("status", ["scheduled", "running", "blocked"])
def test_rerun_is_refused_from_a_status_that_is_not_settled_or_waits_for_resolve(status):
    run = Workflow.objects.create(name="tests.core.workflows.three_steps", status=status)
    Step.objects.create(workflow=run, step_id="1", name=ORDERED, status="done")
    before = snapshot(run)
    refused = f"is {status}: only a failed or stopped or completed run can be re-run"
    with pytest.raises(EverystepError, match=refused):
        history.rerun_from_step(run.pk, "1")
    with pytest.raises(EverystepError, match=f"is {status}: only a failed or stopped or completed run"):
        history.rerun_preview(run.pk, "1")
    with pytest.raises(EverystepError, match=f"a {status} run cannot be re-run from a step"):
        history.rerun_from_step(run.pk, "1", expected_status=status)
    assert snapshot(run) == before


def test_rerun_refuses_malformed_and_unknown_runs_and_unknown_steps():
    run = run_workflow(w.three_steps)
    before = snapshot(run)
    missing = uuid.uuid4()
    operations_ = [history.rerun_from_step, history.fork_from_step]
    operations_ += [history.rerun_preview, history.fork_preview]
    for operation in operations_:
        with pytest.raises(EverystepError, match="'nope' is not a valid run id"):
            operation("nope", "1")
        with pytest.raises(EverystepError, match=f"run {missing} does not exist"):
            operation(missing, "1")
        with pytest.raises(EverystepError, match=r"has no recorded step '9' \(recorded: 1, 2, 3\)"):
            operation(run.pk, "9")
    assert snapshot(run) == before
    assert Workflow.objects.count() == 1


def test_rerun_is_refused_when_the_run_moved_on():
    run = completed_interleaved()
    cut = history.rerun_preview(run.pk, "fan.0.2")
    before = snapshot(run)
    with pytest.raises(EverystepError, match="moved on: it is completed now, not failed; nothing was"):
        history.rerun_from_step(run.pk, "fan.0.2", expected_status="failed", expected_mark=cut.mark)
    # Another operator re-ran it from a later step, and it completed again.
    history.rerun_from_step(run.pk, "4")
    run_once(run)
    moved = snapshot(run)
    with pytest.raises(EverystepError, match="moved on: its recorded steps changed since they were shown"):
        history.rerun_from_step(
            run.pk, "fan.0.2", expected_status="completed", expected_mark=cut.mark, confirm_unsafe=True
        )
    assert snapshot(run) == moved != before


# ---------------------------------------------------------------- fork


def test_a_fork_copies_the_rows_kept_in_recording_order_and_runs_only_the_rest():
    run = completed_interleaved()
    Workflow.objects.filter(pk=run.pk).update(idempotency_key="order-5")
    origin_before = snapshot(run)
    origin_rows = payloads(run)
    fork, cut = history.fork_from_step(run.pk, "fan.0.2", expected_status="completed", confirm_unsafe=True)

    assert snapshot(run) == origin_before  # the origin does not change
    assert (fork.name, fork.args, fork.status, fork.idempotency_key) == (run.name, [5], "scheduled", None)
    link = RunFork.objects.get(run=fork)
    assert (link.origin_id, link.origin_step_id) == (run.pk, "fan.0.2")
    copied = payloads(fork)
    assert set(copied) == {"1", "fan.0.1", "fan.1.1", "fan.1.2", "fan.1.3", "fan.1.4"}
    assert all(copied[step_id] == origin_rows[step_id] for step_id in copied)
    # In the origin's recording order.
    origin_order = [s for s, _, _ in rows(run) if s in copied]
    assert [s for s, _, _ in rows(fork)] == origin_order

    row = run_once(fork)
    assert (row.status, row.result) == ("completed", "end")
    assert w.effects == Counter({"a2": 1, "a3": 1, "charge:50": 1, "end": 1})
    assert payloads(fork) == origin_rows
    # Scheduling with the origin's key still finds the origin.
    assert schedule(h.interleaved, 5, idempotency_key="order-5").pk == run.pk


def test_a_fork_copies_stored_values_exactly():
    at = dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC)
    run = Workflow.objects.create(name="tests.core.workflows.three_steps", status="failed", args=[{"at": at}])
    values = {"at": at, "ids": [uuid.UUID(int=3)], "raw": b"\x00\xff", "wait": dt.timedelta(seconds=90)}
    Step.objects.create(workflow=run, step_id="1", name=ORDERED, status="done", args=[values], result=values)
    Step.objects.create(
        workflow=run, step_id="2", name=ORDERED, status="failed",
        error={"type": "builtins.ValueError", "message": "é ✓", "args": ["é ✓"]},
    )
    Step.objects.create(workflow=run, step_id="3", name=ORDERED, status="done")
    fork, _ = history.fork_from_step(run.pk, "3")
    assert fork.args == [{"at": at}]
    assert payloads(fork) == {k: v for k, v in payloads(run).items() if k != "3"}
    assert payloads(fork)["1"]["result"] == values


def test_a_fork_never_copies_a_started_row_as_done_it_blocks_there():
    run = stopped_with_a_charge_in_flight()
    fork, cut = history.fork_from_step(run.pk, "1.1.2", expected_status="stopped")
    assert [(row.step_id, row.status) for row in cut.uncertain] == [("1.0.1", "started")]
    assert [(s, status) for s, status, _ in rows(fork)] == [("1.0.1", "started"), ("1.1.1", "done")]
    row = run_once(fork)
    assert row.status == "blocked"
    assert f"run {fork.pk}: unsafe-to-repeat step 1.0.1" in row.error["message"]
    operations.resolve_step(fork.pk, "1.0.1", error="not charged")  # resolve's rules hold in the fork
    row = run_once(fork)
    assert row.status == "failed" and row.error["type"] == "everystep.errors.StepFailure"
    assert w.effects["charge:7"] == 0
    assert Workflow.objects.get(pk=run.pk).status == "stopped"


def test_a_fork_of_a_failed_run_can_be_retried_and_forked_again():
    run = run_workflow(h.syncs, "k3")
    fork, _ = history.fork_from_step(run.pk, "2")
    assert [s for s, _, _ in rows(fork)] == ["1"]
    assert run_once(fork).status == "completed"  # flaky succeeds on its second call
    again, _ = history.fork_from_step(fork.pk, "3")
    assert RunFork.objects.get(run=again).origin_id == fork.pk
    assert run_once(again).result == "notify"
    assert list(RunFork.objects.filter(origin=run).values_list("run_id", flat=True)) == [fork.pk]


@pytest.mark.parametrize("status", ["scheduled", "running"])
def test_a_run_that_has_not_ended_is_not_forked(status):
    run = Workflow.objects.create(name="tests.core.workflows.three_steps", status=status)
    Step.objects.create(workflow=run, step_id="1", name=ORDERED, status="done")
    with pytest.raises(EverystepError, match=f"is {status}: only a completed or failed or stopped or"):
        history.fork_from_step(run.pk, "1")
    assert Workflow.objects.count() == 1 and not RunFork.objects.exists()


def test_fork_refusals_write_nothing():
    run = completed_interleaved()
    cut = history.fork_preview(run.pk, "fan.1.3")
    with pytest.raises(EverystepError, match=r"forking from step fan.1.3 runs again 2 unsafe-to-repeat"):
        history.fork_from_step(run.pk, "fan.1.3")
    with pytest.raises(EverystepError, match="moved on: it is completed now, not failed"):
        history.fork_from_step(run.pk, "fan.1.3", expected_status="failed", confirm_unsafe=True)
    Step.objects.filter(workflow=run, step_id="4").delete()
    with pytest.raises(EverystepError, match="moved on: its recorded steps changed"):
        history.fork_from_step(run.pk, "fan.1.3", expected_mark=cut.mark, confirm_unsafe=True)
    assert Workflow.objects.count() == 1 and not RunFork.objects.exists()
    assert Step.objects.count() == 9


def test_deleting_the_origin_keeps_the_fork_and_deleting_the_fork_drops_its_link():
    run = run_workflow(w.three_steps)
    fork, _ = history.fork_from_step(run.pk, "2")
    second, _ = history.fork_from_step(run.pk, "3")
    Workflow.objects.filter(pk=second.pk).delete()
    assert list(RunFork.objects.values_list("run_id", flat=True)) == [fork.pk]
    long_ago = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    Workflow.objects.filter(pk=run.pk, status="completed").update(completed_at=long_ago)
    assert operations.prune(older_than=dt.timedelta(days=1)) == 1
    link = RunFork.objects.get(run=fork)
    assert (link.origin_id, link.origin_step_id) == (None, "2")
    assert [s for s, _, _ in rows(fork)] == ["1"]


# ---------------------------------------------------------------- races


class Holder:
    """Runs ``operation`` on a thread that pauses while it holds the run's lock
    (in the cut, which both operations make under the lock, or in retry's
    preview of what it discards), until ``release()``."""

    def __init__(self, monkeypatch, operation):
        self.locked, self.go = threading.Event(), threading.Event()
        self.result = self.error = None
        holder = self

        def pausing(original):
            def wrapper(*args, **kwargs):
                if threading.current_thread() is holder.thread:
                    holder.locked.set()
                    assert holder.go.wait(30), "the holder was never released"
                return original(*args, **kwargs)

            return wrapper

        monkeypatch.setattr(history, "_cut", pausing(history._cut))
        monkeypatch.setattr(operations, "_discardable", pausing(operations._discardable))
        self.thread = threading.Thread(target=self._run, args=(operation,))
        self.thread.start()
        assert self.locked.wait(30), "the holder never took the lock"

    def _run(self, operation):
        try:
            self.result = operation()
        except Exception as exc:
            self.error = exc
        finally:
            connections.close_all()

    def release(self):
        self.go.set()
        self.thread.join(30)


def concurrently(operation):
    """Start ``operation`` on a thread; ``join()`` returns (result, error)."""
    out = {}

    def run():
        try:
            out["result"] = operation()
        except Exception as exc:
            out["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()

    def join():
        thread.join(30)
        assert not thread.is_alive()
        return out.get("result"), out.get("error")

    return join


def wait_for_a_lock_wait(what: str) -> None:
    # InnoDB refreshes its transaction table only when it was not read for
    # 0.1 s: polled more often, it would never show the wait.
    wait_for(waiting_for_a_lock, interval=0.2, what=what)


def waiting_for_a_lock() -> bool:
    """Whether another session of this database waits for a row lock (SQLite
    cannot say: there the second transaction waits at its start)."""
    conn = database.connection()
    with conn.cursor() as cursor:
        if conn.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE NOT l.granted AND a.datname = current_database()"
            )
        elif conn.vendor == "mysql":
            cursor.execute(
                "SELECT count(*) FROM information_schema.innodb_trx t JOIN information_schema.processlist p "
                "ON p.id = t.trx_mysql_thread_id WHERE t.trx_state = 'LOCK WAIT' AND p.db = DATABASE()"
            )
        else:
            return True
        return cursor.fetchone()[0] > 0


def test_two_operators_rerunning_at_once_one_wins_the_other_writes_nothing(monkeypatch):
    run = completed_interleaved()
    cut = history.rerun_preview(run.pk, "fan.0.2")
    seen = {"expected_status": "completed", "expected_mark": cut.mark, "confirm_unsafe": True}
    first = Holder(monkeypatch, lambda: history.rerun_from_step(run.pk, "fan.0.2", **seen))
    second = concurrently(lambda: history.rerun_from_step(run.pk, "fan.1.1", **seen))
    wait_for_a_lock_wait("the second re-run to wait for the run's lock")
    first.release()
    result, error = second()
    assert first.error is None and first.result.step.step_id == "fan.0.2"
    assert result is None
    assert "moved on: it is scheduled now, not completed; nothing was changed" in str(error)
    # Exactly the first one's rows were discarded.
    assert sorted(s for s, _, _ in rows(run)) == ["1", "fan.0.1", "fan.1.1", "fan.1.2", "fan.1.3", "fan.1.4"]


def test_a_rerun_racing_a_retry_writes_nothing_once_the_retry_committed(monkeypatch):
    run = run_workflow(h.syncs, "k4")
    cut = history.rerun_preview(run.pk, "1")
    retry = Holder(monkeypatch, lambda: operations.retry_run(run.pk, expected_status="failed"))
    rerun = concurrently(
        lambda: history.rerun_from_step(run.pk, "1", expected_status="failed", expected_mark=cut.mark)
    )
    wait_for_a_lock_wait("the re-run to wait for the run's lock")
    retry.release()
    _, error = rerun()
    assert retry.error is None and [row.step_id for row in retry.result] == ["2"]
    assert "moved on: it is scheduled now, not failed" in str(error)
    assert [s for s, _, _ in rows(run)] == ["1"]  # retry's cut, not the re-run's


def test_a_fork_and_a_rerun_at_once_the_fork_copies_the_history_it_locked(monkeypatch):
    run = completed_interleaved()
    before = payloads(run)
    fork = Holder(monkeypatch, lambda: history.fork_from_step(run.pk, "4", expected_status="completed"))
    rerun = concurrently(lambda: history.rerun_from_step(run.pk, "1", confirm_unsafe=True))
    wait_for_a_lock_wait("the re-run to wait for the run's lock")
    fork.release()
    cut, error = rerun()
    assert fork.error is None and error is None
    forked, _ = fork.result
    assert payloads(forked) == {k: v for k, v in before.items() if k != "4"}
    assert rows(run) == [] and len(cut.discarded) == 10


def test_a_fork_requested_twice_at_once_is_made_once(monkeypatch):
    """The same request (``fork_id``) sent twice: the second waits for the
    origin's lock, then finds the first one's fork and writes nothing."""
    run = completed_interleaved()
    fork_id = uuid.uuid4()
    first = Holder(monkeypatch, lambda: history.fork_from_step(run.pk, "4", fork_id=fork_id))
    second = concurrently(lambda: history.fork_from_step(run.pk, "4", fork_id=fork_id))
    wait_for_a_lock_wait("the second fork to wait for the run's lock")
    first.release()
    result, error = second()
    assert first.error is None and first.result[0].pk == fork_id and result is None
    assert isinstance(error, history.AlreadyForked) and error.fork_id == fork_id
    assert str(error) == (
        f"run {run.pk} was already forked into run {fork_id} by this request; nothing was changed"
    )
    assert RunFork.objects.get().run_id == fork_id and Workflow.objects.count() == 2
    assert Step.objects.filter(workflow_id=fork_id).count() == 9


def test_a_fork_id_that_is_another_run_is_refused():
    run = completed_interleaved()
    other = run_workflow(w.three_steps)
    taken = f"the fork's id {other.pk} is another run's; nothing was changed"
    with pytest.raises(EverystepError, match=taken):
        history.fork_from_step(run.pk, "4", fork_id=other.pk)
    with pytest.raises(EverystepError, match="'nope' is not a valid run id"):
        history.fork_from_step(run.pk, "4", fork_id="nope")
    assert Workflow.objects.count() == 2 and not RunFork.objects.exists()


def test_a_fork_after_a_rerun_committed_is_refused(monkeypatch):
    run = completed_interleaved()
    cut = history.fork_preview(run.pk, "4")
    rerun = Holder(monkeypatch, lambda: history.rerun_from_step(run.pk, "4"))
    fork = concurrently(
        lambda: history.fork_from_step(run.pk, "4", expected_status="completed", expected_mark=cut.mark)
    )
    wait_for_a_lock_wait("the fork to wait for the run's lock")
    rerun.release()
    _, error = fork()
    assert rerun.error is None
    assert "moved on: it is scheduled now, not completed" in str(error)
    assert Workflow.objects.count() == 1 and not RunFork.objects.exists()

