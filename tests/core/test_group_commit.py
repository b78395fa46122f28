"""Steps recorded at the same moment by one process's threads share a commit
(everystep.group_commit, and the step insert in everystep.statements)."""

import threading

import pytest
from django.db import DEFAULT_DB_ALIAS, DataError, connections

from everystep import group_commit, statements
from everystep.models import Step, Workflow
from tests.core.test_statements import VALUE, autocommit_postgresql, insert, psycopg_session
from tests.helpers import CLAIMER
from tests.worker.support import wait_for


def on_a_thread(call):
    """Start ``call`` on a thread of its own (with its own database connection);
    the returned function joins it and gives what it returned or raised."""
    out = {}

    def run():
        try:
            out["result"] = call()
        except BaseException as exc:
            out["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()

    def join():
        thread.join(30)
        assert not thread.is_alive()
        if "error" in out:
            raise out["error"]
        return out["result"]

    return join


# ----------------------------------------------------------- the gathering


class Writes:
    """A ``write`` for GroupCommit that records each batch, and holds the first
    one until released, so that the test decides what queues behind it."""

    def __init__(self, outcome=lambda item: item.upper()):
        self.batches = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.outcome = outcome

    def __call__(self, items):
        self.batches.append(items)
        if len(self.batches) == 1:
            self.started.set()
            assert self.release.wait(30)
        return [self.outcome(item) for item in items]


def submit_all(commits, write, items):
    """``items[0]`` submitted first and held in its write; the rest queue behind it."""
    first = on_a_thread(lambda: commits.submit(items[0], write))
    assert write.started.wait(30)
    rest = [on_a_thread(lambda item=item: commits.submit(item, write)) for item in items[1:]]
    wait_for(lambda: commits.queued() == len(rest), what="the other items to queue")
    write.release.set()
    return [first] + rest


def test_items_submitted_during_a_write_go_out_together_as_the_next_one():
    commits, write = group_commit.GroupCommit(), Writes()
    joins = submit_all(commits, write, ["a", "b", "c", "d"])
    assert [join() for join in joins] == ["A", "B", "C", "D"]  # each its own outcome
    assert write.batches[0] == ["a"]
    assert sorted(write.batches[1]) == ["b", "c", "d"] and len(write.batches) == 2
    assert commits.submit("e", write) == "E" and write.batches[2] == ["e"]  # nothing held over


def test_an_outcome_that_is_an_exception_is_raised_to_its_item_only():
    def outcome(item):
        return ValueError(item) if item == "c" else item.upper()

    commits, write = group_commit.GroupCommit(), Writes(outcome)
    joins = dict(zip("abcd", submit_all(commits, write, list("abcd")), strict=True))
    with pytest.raises(ValueError, match="c"):
        joins.pop("c")()
    assert {item: join() for item, join in joins.items()} == {"a": "A", "b": "B", "d": "D"}


def test_a_write_that_fails_wakes_every_item_it_carried_with_the_error():
    def outcome(item):
        if item != "a":
            raise RuntimeError("a bug in the write")
        return "A"

    commits, write = group_commit.GroupCommit(), Writes(outcome)
    joins = submit_all(commits, write, list("abc"))
    assert joins[0]() == "A"
    for join in joins[1:]:
        with pytest.raises(RuntimeError, match="a bug in the write"):
            join()
    assert commits.submit("a", write) == "A"  # the next write goes out: nothing stuck


# ------------------------------------------------------ the gathered insert


def running_runs(count: int) -> list[Workflow]:
    return [Workflow.objects.create(name="x.y", args=[], status="running", claimed_by=CLAIMER)
            for _ in range(count)]


def a_lock_wait() -> bool:
    with psycopg_session() as other:
        return other.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE NOT l.granted AND a.datname = current_database()"
        ).fetchone()[0] > 0


def insert_together(first: Workflow, others: list, insert_other=lambda run: insert(run.id, "1")):
    """Record a step of ``first`` while its run's row is locked by another
    session, so that its insert waits in its foreign key check; the steps of
    ``others`` are recorded meanwhile, on threads of their own, and queue."""
    with psycopg_session() as locker, locker.transaction():
        locker.execute("SELECT FROM everystep_workflow WHERE id = %s FOR UPDATE", [first.id])
        joins = [on_a_thread(lambda: insert(first.id, "1"))]
        wait_for(a_lock_wait, what="the first insert to wait for the run's lock")
        joins += [on_a_thread(lambda run=run: insert_other(run)) for run in others]
        commits = statements._step_commits[DEFAULT_DB_ALIAS]
        wait_for(lambda: commits.queued() == len(others), what="the other steps to queue")
    return joins


def transactions_of_steps() -> dict:
    """Each run's step ``1``: the transaction that wrote it."""
    with psycopg_session() as other:
        return dict(other.execute("SELECT workflow_id, xmin::text FROM everystep_step WHERE step_id = '1'"))


@pytest.mark.django_db(transaction=True)
def test_steps_recorded_while_one_is_in_flight_are_committed_together():
    autocommit_postgresql()
    first, *others = running_runs(4)
    joins = insert_together(first, others)
    assert [join() for join in joins] == [True] * 4
    written_by = transactions_of_steps()
    assert len({written_by[run.id] for run in others}) == 1  # one transaction for the three
    assert written_by[first.id] != written_by[others[0].id]
    step = Step.objects.get(workflow=others[1])
    assert (step.name, step.status, step.args, step.kwargs) == ("a.b", "done", [VALUE], {})


@pytest.mark.django_db(transaction=True)
def test_each_step_of_a_gathered_insert_is_fenced_on_its_own_run():
    autocommit_postgresql()
    first, stopped, running = running_runs(3)
    Workflow.objects.filter(id=stopped.id).update(status="stopped")
    joins = insert_together(first, [stopped, running])
    assert [join() for join in joins] == [True, False, True]
    assert set(Step.objects.values_list("workflow_id", flat=True)) == {first.id, running.id}


@pytest.mark.django_db(transaction=True)
def test_a_step_the_server_refuses_fails_alone_and_the_others_of_its_insert_are_recorded():
    autocommit_postgresql()
    first, refused, *others = running_runs(4)

    def insert_other(run):
        # jsonb has no NUL character: PostgreSQL refuses the value.
        return insert(run.id, "1", result="nul \x00" if run == refused else None)

    joins = insert_together(first, [refused, *others], insert_other)
    assert joins[0]() is True
    with pytest.raises(DataError, match="Unicode"):
        joins[1]()
    assert [join() for join in joins[2:]] == [True, True]
    assert set(Step.objects.values_list("workflow_id", flat=True)) == {first.id, *(run.id for run in others)}
