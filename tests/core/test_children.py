"""start_child: a child run started from a workflow's body, recorded like a
step, linked to its parent, and never started twice (replays, crashes at every
point of the start, a second worker replaying the same parent)."""

import datetime as dt
import threading
import uuid

import pytest
from django.core.management import call_command

from everystep import children, database, history, operations, runner, sleep, step, workflow
from everystep.api import schedule, start_child
from everystep.errors import EverystepError, SimulatedCrash
from everystep.models import ChildRun, Step, Workflow
from tests.core import child_workflows as cw
from tests.core import workflows as w
from tests.helpers import CLAIMER, claim, crash_before_end, run_once, run_workflow

pytestmark = pytest.mark.django_db(transaction=True)

CHILD = "tests.core.child_workflows.child_of"
OTHER_CHILD = "tests.core.child_workflows.other_child_of"


def children_of(parent) -> list[Workflow]:
    return list(Workflow.objects.filter(parent_link__parent_id=parent.id).order_by("id"))


def test_start_child_schedules_one_linked_child_and_records_the_call():
    parent = run_workflow(cw.starts_one_child, 5)
    assert parent.status == "completed"
    [child] = children_of(parent)
    assert (child.name, child.args, child.status) == (CHILD, [5], "scheduled")
    assert parent.result == str(child.id)
    link = ChildRun.objects.get(child_id=child.id)
    assert (link.parent_id, link.step_id) == (parent.id, "1")
    row = Step.objects.get(workflow_id=parent.id, step_id="1")
    assert (row.name, row.status, row.args, row.result) == (CHILD, "done", [5], child.id)
    # The child is an ordinary run: any worker claims and runs it.
    assert run_once(child).result == "child:5"


def test_each_call_starts_its_own_child_and_a_named_call_keeps_its_name():
    parent = run_workflow(cw.starts_two_children)
    links = dict(ChildRun.objects.filter(parent_id=parent.id).values_list("step_id", "child_id"))
    assert set(links) == {"1", "second"}
    assert parent.result == [str(links["1"]), str(links["second"])]


def test_a_replay_serves_the_recorded_child_and_starts_no_second_one():
    parent = schedule(cw.starts_one_child, 1)
    with crash_before_end(), pytest.raises(SimulatedCrash):  # every step recorded, the end lost
        runner.execute(claim(parent), CLAIMER)
    parent = Workflow.objects.get(id=parent.id)
    assert parent.status == "running"
    [child] = children_of(parent)
    assert run_once_again(parent).result == str(child.id)
    assert children_of(parent) == [child]
    assert w.effects["after-start:1"] == 1  # served from the store, like the call


def test_a_crash_between_the_childs_insert_and_its_record_finds_the_same_child():
    def die_after_the_insert(ctx, step_id):
        if step_id == "1":
            runner.fault = None
            raise SimulatedCrash("power cut after the child was inserted")

    runner.fault = die_after_the_insert
    parent = run_workflow(cw.starts_one_child, 2)
    [child] = children_of(parent)
    assert not Step.objects.filter(workflow_id=parent.id).exists()  # the call was not recorded
    parent = run_once_again(parent)
    assert parent.status == "completed"
    assert children_of(parent) == [child]
    assert Step.objects.get(workflow_id=parent.id, step_id="1").result == child.id


def test_a_crash_inside_the_childs_transaction_leaves_no_child(monkeypatch):
    def die(**kwargs):
        raise SimulatedCrash("power cut between the child's insert and its link")

    monkeypatch.setattr(ChildRun.objects, "create", die)
    parent = run_workflow(cw.starts_one_child, 3)
    assert parent.status == "running"
    # Rolled back with its link: no orphan child runs unlinked.
    assert not Workflow.objects.filter(name=CHILD).exists()
    monkeypatch.undo()
    parent = run_once_again(parent)
    assert parent.status == "completed"
    assert len(children_of(parent)) == 1
    assert Workflow.objects.filter(name=CHILD).count() == 1


def test_a_crash_after_the_record_serves_the_child_on_the_next_pass():
    def die_at_the_next_step(ctx, step_id):
        if step_id == "2":
            runner.fault = None
            raise SimulatedCrash("power cut after the call was recorded")

    runner.fault = die_at_the_next_step
    parent = run_workflow(cw.starts_one_child, 4)
    [child] = children_of(parent)
    assert run_once_again(parent).result == str(child.id)
    assert children_of(parent) == [child]


def test_a_parent_that_is_no_longer_this_workers_starts_no_child():
    parent = schedule(cw.starts_one_child, 6)
    claim(parent, "another-worker")
    # This worker still thinks it runs the parent (it was requeued and taken over).
    assert runner.execute(Workflow.objects.get(id=parent.id), CLAIMER) is None
    assert not Workflow.objects.filter(name=CHILD).exists()
    assert not ChildRun.objects.exists()


def test_two_workers_replaying_one_parent_start_one_child():
    """Worker A inserted the child and is paused before recording the call; the
    parent is requeued and worker B replays it to the end; then A goes on."""
    parent = schedule(cw.starts_one_child, 8)
    claim(parent, "worker-a")
    inserted, resume = threading.Event(), threading.Event()

    def pause_a(ctx, step_id):
        if ctx.state.claimer == "worker-a" and step_id == "1":
            inserted.set()
            assert resume.wait(30)

    runner.fault = pause_a
    outcome = {}

    def worker_a():
        try:
            outcome["a"] = runner.execute(Workflow.objects.get(id=parent.id), "worker-a")
        finally:
            database.connection().close()

    thread = threading.Thread(target=worker_a)
    thread.start()
    try:
        assert inserted.wait(30)
        operations.requeue_run(parent.id)
        finished = run_once(Workflow.objects.get(id=parent.id), "worker-b")
    finally:
        resume.set()
        thread.join(60)
    assert not thread.is_alive()
    assert outcome["a"] is None  # fenced out: it wrote nothing more
    assert finished.status == "completed"
    [child] = children_of(parent)
    assert Workflow.objects.filter(name=CHILD).count() == 1
    assert finished.result == str(child.id)
    assert Step.objects.get(workflow_id=parent.id, step_id="1").result == child.id


def test_a_rerun_that_starts_another_workflow_at_the_call_links_the_new_child(monkeypatch):
    """Re-run from before the call after the body changed its mind: the call
    runs anew and starts the other workflow's child (the key is the same, the
    name is not); the call's one link moves to it, and the first child is left
    as it was. Choosing the first workflow again finds its child again."""
    parent = run_workflow(cw.starts_the_chosen_child, 11)
    [first] = children_of(parent)
    monkeypatch.setitem(cw.CHOSEN, "child", "other_child_of")
    history.rerun_from_step(parent.id, "1")
    parent = run_once(Workflow.objects.get(id=parent.id))
    assert parent.status == "completed", parent.error
    [other] = children_of(parent)
    assert (other.name, other.args, other.status) == (OTHER_CHILD, [11], "scheduled")
    assert parent.result == str(other.id)
    assert ChildRun.objects.get(child_id=other.id).step_id == "2"
    assert Step.objects.get(workflow_id=parent.id, step_id="2").result == other.id
    # The first child is a run of its own: still there, no longer linked.
    assert Workflow.objects.get(id=first.id).status == "scheduled"
    assert not ChildRun.objects.filter(child_id=first.id).exists()

    monkeypatch.setitem(cw.CHOSEN, "child", "child_of")
    history.rerun_from_step(parent.id, "1")
    parent = run_once(Workflow.objects.get(id=parent.id))
    assert parent.result == str(first.id)
    assert children_of(parent) == [first]
    assert Workflow.objects.filter(id__in=[first.id, other.id]).count() == 2


def test_start_child_outside_a_run_or_inside_a_step_is_refused():
    with pytest.raises(EverystepError, match="outside a workflow run; outside a run, use schedule"):
        start_child(cw.child_of, 1)
    row = run_workflow(cw.calls_start_child_in_a_step)
    assert row.status == "failed"
    assert "inside step 1 of run" in row.error["message"]
    assert not Workflow.objects.filter(name=CHILD).exists()


@pytest.mark.parametrize(
    "call, error, problem",
    [
        (lambda: start_child(w.record, "x"), TypeError, "start_child() needs a @workflow function"),
        (lambda: start_child(cw.child_of, 1, 2), TypeError, "arguments do not fit workflow"),
        (lambda: start_child(cw.child_of, object()), EverystepError, "arguments are not serializable"),
    ],
)
def test_start_child_refuses_bad_input_before_writing(call, error, problem):
    with pytest.raises(error, match=problem.replace("(", r"\(").replace(")", r"\)")):
        call()
    assert not Workflow.objects.exists()


def test_a_recorded_child_of_another_workflow_is_a_divergence():
    parent = schedule(cw.starts_one_child, 9)
    claim(parent)
    Step.objects.create(workflow_id=parent.id, step_id="1", name="tests.core.other", status="done")
    row = run_once_again(parent, claim_first=False)
    assert row.status == "failed"
    assert "was recorded as tests.core.other" in row.error["message"]
    assert not Workflow.objects.filter(name=CHILD).exists()


def test_the_childs_key_is_bounded_and_distinct_for_long_step_ids():
    parent_id = uuid.uuid4()
    long_a, long_b = "a" * 299 + "1", "a" * 299 + "2"
    keys = {children.child_key(parent_id, step_id) for step_id in ("1", long_a, long_b)}
    assert len(keys) == 3
    assert all(len(key) <= 255 and children.is_child_key(key) for key in keys)
    assert not children.is_child_key("user-key") and not children.is_child_key(None)


def test_pruning_a_parent_deletes_its_links_and_keeps_its_children():
    import datetime as dt

    parent = run_workflow(cw.starts_one_child, 10)
    [child] = children_of(parent)
    assert operations.prune(older_than=dt.timedelta(0)) == 1
    assert not ChildRun.objects.exists()
    assert Workflow.objects.get(id=child.id).status == "scheduled"


def test_unfinished_descendants_reach_grandchildren_through_ended_children():
    top = run_workflow(cw.starts_a_grandparent_chain)
    [middle] = children_of(top)
    middle = run_once(middle)  # completes, leaving its own child scheduled
    [grandchild] = children_of(middle)
    assert children.unfinished_descendants(top.id) == [(grandchild.id, "scheduled")]
    assert children.unfinished_descendants(grandchild.id) == []


def run_once_again(run, *, claim_first=True) -> Workflow:
    """The next pass of ``run``: claimed again if it was left ``running``."""
    row = Workflow.objects.get(id=run.id)
    if claim_first and row.status == "running":
        operations.release_run(row.id, row.claimed_by)
    if claim_first:
        return run_once(row)
    runner.execute(row, CLAIMER)
    return Workflow.objects.get(id=run.id)


# docs/children.md: "re-running the parent from before its start_child step
# finds the same child again (the key is the same)", also after a prune.

charges = []


@step
def charge_card(order):
    charges.append(order)
    return "charged"


@workflow
def charge(order):
    return charge_card(order)


@step
def load(order):
    return order


@step
def ship(order):
    raise RuntimeError("the courier's API is down")


@workflow
def checkout(order):
    load(order)
    handle = start_child(charge, order)
    handle.result()
    sleep(dt.timedelta(days=45))
    return ship(order)


def test_rerun_from_before_start_child_after_a_prune_does_not_charge_again():
    charges.clear()
    parent = run_once(schedule(checkout, "B-2"))
    assert parent.status == "waiting"
    child = Workflow.objects.get(idempotency_key__startswith="everystep.child:")
    child = run_once(child)
    assert run_once(Workflow.objects.get(id=parent.id)).status == "waiting"  # now in its sleep
    Workflow.objects.filter(id=child.id).update(completed_at=child.completed_at - dt.timedelta(days=40))
    # The child is kept while its parent (waiting) is.
    assert operations.prune(older_than=dt.timedelta(days=30), dry_run=True) == 0
    call_command("everystep_prune", "--older-than", "30")
    operations.wake_now(parent.id)
    assert run_once(Workflow.objects.get(id=parent.id)).status == "failed"

    # The operator re-runs it from its first step; nothing asks to confirm a charge.
    call_command("everystep_rerun", str(parent.id), "1")
    run_once(Workflow.objects.get(id=parent.id))
    for run in Workflow.objects.filter(name=child.name, status="scheduled"):
        run_once(run)
    assert charges == ["B-2"], "the re-run started a second charge child: its key was pruned"

    # Pruned with its parent: the parent first, the child in the same prune after it.
    assert Workflow.objects.get(id=parent.id).status == "waiting"  # in its sleep again
    operations.stop_run(parent.id)
    Workflow.objects.filter(id__in=[parent.id, child.id]).update(
        completed_at=child.completed_at - dt.timedelta(days=40)
    )
    assert operations.prune(older_than=dt.timedelta(days=30), dry_run=True) == 2
    assert operations.prune(older_than=dt.timedelta(days=30), batch=1) == 2
    assert not Workflow.objects.exists()


def test_pruning_a_chain_of_children_takes_a_query_per_generation_not_a_batch_per_run():
    """Each run started by the one before: one batch (a transaction, a scan of
    the runs still linked, its cron and waiter reads) per run made the prune
    quadratic, 3,603 queries for 300 runs."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    ended = dt.datetime.now(dt.UTC) - dt.timedelta(days=40)
    chain = Workflow.objects.bulk_create(
        [Workflow(name="loop", args=[], status="completed", completed_at=ended) for _ in range(300)]
    )
    links = zip(chain[:-1], chain[1:], strict=True)
    ChildRun.objects.bulk_create([ChildRun(child=c, parent=p, step_id="1") for p, c in links])
    with CaptureQueriesContext(connections[database.alias()]) as queries:
        assert operations.prune(older_than=dt.timedelta(days=30)) == 300
    assert len(queries) < 2 * len(chain), f"{len(queries)} queries to prune a chain of {len(chain)} runs"
    assert not Workflow.objects.exists()

