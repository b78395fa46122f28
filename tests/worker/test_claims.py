"""The claim query: disjoint under concurrency on every backend, served by the
partial index on PostgreSQL, and a pinned number of queries."""

import datetime
import tempfile
import threading
import uuid
from collections import Counter

import pytest
from django.db import connections, transaction

from everystep import claims, database
from everystep.models import Workflow

CHAIN = "tests.worker.workflows.chain"


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_take_disjoint_sets():
    Workflow.objects.bulk_create(Workflow(name=CHAIN, args=[]) for _ in range(120))
    claimed: list = []
    errors: list = []
    start = threading.Barrier(6)

    def claimer(name):
        try:
            start.wait()
            while batch := claims.claim_runs(name, 5):
                claimed.extend((run.id, name) for run in batch)
        except Exception as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    ids = Counter(run_id for run_id, _ in claimed)
    assert len(ids) == 120 and set(ids.values()) == {1}  # every run claimed, none twice
    by_worker = dict(Workflow.objects.values_list("id", "claimed_by"))
    assert all(by_worker[run_id] == name for run_id, name in claimed)
    assert not Workflow.objects.filter(status="scheduled").exists()


@pytest.mark.django_db
def test_the_claim_query_uses_the_partial_index_on_postgresql():
    if database.connection().vendor != "postgresql":
        pytest.skip("the partial index is PostgreSQL's (MySQL gets a (status, created_at) index)")
    Workflow.objects.bulk_create(Workflow(name=CHAIN, args=[]) for _ in range(50))
    params = ["w1", [uuid.uuid4()], 4]
    with transaction.atomic(using=database.alias()), database.connection().cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {claims.POSTGRESQL}", params)  # without ANALYZE: changes nothing
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "everystep_workflow_claim_idx" in plan
    assert "LockRows" in plan
    assert Workflow.objects.filter(status="scheduled").count() == 50


@pytest.mark.django_db(transaction=True)
def test_a_claim_skips_runs_another_claimer_has_locked_instead_of_waiting():
    if database.connection().vendor != "postgresql":
        pytest.skip("SKIP LOCKED is PostgreSQL's claim; MariaDB/MySQL's claim waits on the lock")
    older, newer = (Workflow.objects.create(name=CHAIN, args=[]) for _ in range(2))
    locked, release = threading.Event(), threading.Event()

    def other_claimer():  # holds the oldest run's row lock, as a claim in progress does
        try:
            with database.atomic():
                Workflow.objects.select_for_update().get(id=older.id)
                locked.set()
                release.wait(60)
        finally:
            database.connection().close()

    thread = threading.Thread(target=other_claimer)
    thread.start()
    try:
        assert locked.wait(30)
        with database.connection().cursor() as cursor:
            # Only bounds a claim that waits (the broken case): it fails instead of hanging.
            cursor.execute("SET lock_timeout = '5s'")
        claimed = claims.claim_runs("w1", 2)
    finally:
        release.set()
        thread.join(60)
        with database.connection().cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert [run.id for run in claimed] == [newer.id]
    assert Workflow.objects.get(id=older.id).status == "scheduled"


@pytest.mark.django_db(transaction=True)  # a real transaction, as in the worker: no savepoints
def test_claim_query_count(django_assert_num_queries):
    # SQLite claims in one autocommit UPDATE ... RETURNING; MariaDB/MySQL in a
    # transaction (Django logs BEGIN and COMMIT as queries): the locking SELECT,
    # then the UPDATE. PostgreSQL's claim bypasses Django's cursor: see below.
    if database.connection().vendor == "postgresql":
        pytest.skip("PostgreSQL claims through a prepared statement: test_one_round_trip_on_postgresql")
    engine_db = database.connection()
    one_statement = engine_db.vendor == "sqlite"
    with django_assert_num_queries(1 if one_statement else 3, connection=engine_db):  # an empty queue
        assert claims.claim_runs("w1", 4) == []
    Workflow.objects.bulk_create(Workflow(name=CHAIN, args=[]) for _ in range(3))
    with django_assert_num_queries(1 if one_statement else 4, connection=engine_db):
        assert len(claims.claim_runs("w1", 4)) == 3


@pytest.mark.django_db(transaction=True)
def test_one_round_trip_on_postgresql():
    if database.connection().vendor != "postgresql":
        pytest.skip("the prepared claim is PostgreSQL's")
    args = [{"day": datetime.date(2026, 12, 2)}, (1, 2)]
    Workflow.objects.bulk_create(Workflow(name=CHAIN, args=args) for _ in range(5))
    # The first claim of a batch on a connection also prepares the statement
    # (a claim of one run has a statement of its own).
    claims.claim_runs("w0", 2, exclude=[uuid.uuid4()])
    pgconn = database.connection().connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())  # libpq's log of every protocol message
        try:
            claimed = claims.claim_runs("w1", 4, exclude=[uuid.uuid4()])
        finally:
            pgconn.untrace()
        trace.seek(0)
        sent = [line.split("\t")[3].strip() for line in trace if line.split("\t")[1] == "F"]
    assert len(claimed) == 3 and {run.claimed_by for run in claimed} == {"w1"}
    # Whole rows, decoded as the ORM decodes them.
    expected = Workflow.objects.get(id=claimed[0].id)
    assert claimed[0].get_deferred_fields() == set()
    assert [getattr(claimed[0], f.attname) for f in Workflow._meta.concrete_fields] == [
        getattr(expected, f.attname) for f in Workflow._meta.concrete_fields
    ]
    assert claimed[0].args == args
    # Each Sync (or simple Query) is one round trip; BEGIN/COMMIT would be more.
    assert sum(message in ("Sync", "Query") for message in sent) == 1
    assert "BEGIN" not in " ".join(sent)


@pytest.mark.django_db(transaction=True)
def test_a_claim_says_which_runs_have_recorded_steps():
    """The runner loads a claimed run's outcomes only when it has some. MariaDB/MySQL's
    claim cannot tell: its runs carry no answer, and the runner loads them."""
    from everystep.models import Step

    fresh, resumed = Workflow.objects.bulk_create(Workflow(name=CHAIN, args=[]) for _ in range(2))
    Step.objects.create(workflow=resumed, step_id="1", name="tests.worker.workflows.mark", status="done")
    claimed = {run.id: run for run in claims.claim_runs("w1", 2)}
    if database.connection().vendor == "mysql":
        assert not any(hasattr(run, "has_steps") for run in claimed.values())
    else:
        assert (bool(claimed[fresh.id].has_steps), bool(claimed[resumed.id].has_steps)) == (False, True)


@pytest.mark.django_db
def test_the_limited_workflows_names_reach_the_claim_whatever_their_characters():
    """The claim passing over limited workflows gets their names as one text[]
    literal (the libpq path sends text): quotes, backslashes, commas, braces and
    spaces arrive as they were."""
    if database.connection().vendor != "postgresql":
        pytest.skip("the text[] literal is PostgreSQL's")
    names = ["shop.flows.a", 'we"ird', "back\\slash", "com,ma", "{brace}", "sp ace", "NULL", ""]
    with database.connection().cursor() as cursor:
        cursor.execute("SELECT %s::text[]", [claims._text_array(names)])
        assert cursor.fetchone()[0] == names


@pytest.mark.django_db(transaction=True)
def test_a_claim_of_one_run_is_planned_once_per_connection():
    """A pool thread claims its next run alone, once per run. With the limit as
    a parameter, PostgreSQL would plan that prepared claim again at every
    execution (pg_prepared_statements counts each custom plan); with LIMIT 1 in
    its text, it settles on one generic plan after its first five. The table
    is analyzed, as autovacuum does: with statistics of a queue of a thousand
    runs, a generic plan with the limit unknown costs more than the custom ones."""
    if database.connection().vendor != "postgresql":
        pytest.skip("PostgreSQL's plan cache")
    Workflow.objects.bulk_create(Workflow(name=CHAIN, args=[]) for _ in range(1000))
    with database.connection().cursor() as cursor:
        cursor.execute("ANALYZE everystep_workflow")
    for _ in range(12):
        assert len(claims.claim_runs("w1", 1)) == 1
    with database.connection().cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE 'UPDATE everystep_workflow SET status = ''running''%%'"
        )
        (generic, custom), *others = cursor.fetchall()
    assert others == [] and custom <= 5 and generic >= 7


# ---------------------------------------------------------------- a run's end with the next claim


def _ended_and_waiting(claimer="w1", waiting=1):
    """A run ``running`` under ``claimer`` and ``waiting`` scheduled runs behind it."""
    ending = Workflow.objects.create(name=CHAIN, args=[], status="running", claimed_by=claimer)
    queued = Workflow.objects.bulk_create(Workflow(name=CHAIN, args=[[1, 2]]) for _ in range(waiting))
    return ending, queued


def _finish(next_claim, run, status="completed", **values):
    return next_claim.finish(run.id, "w1", status, **values)


@pytest.mark.django_db(transaction=True)
def test_a_runs_end_takes_the_next_claim_with_it_on_postgresql():
    """One statement, one round trip: the run ends as ``finish_run`` ends it, and
    the oldest scheduled run is claimed, whole, as ``claim_runs`` returns it.
    Elsewhere the end goes alone and the thread claims as before."""
    ending, (queued,) = _ended_and_waiting()
    next_claim = claims.NextClaim(lambda: [ending.id])
    postgresql = database.connection().vendor == "postgresql"
    if postgresql:
        _finish(next_claim, Workflow.objects.create(name=CHAIN, args=[], status="running", claimed_by="w1"))
        queued.refresh_from_db()
        assert queued.status == "running"
        Workflow.objects.filter(id=queued.id).update(status="scheduled", claimed_by=None)
        # Prepared now: the next end with a claim is a single Sync.
        pgconn = database.connection().connection.pgconn
        with tempfile.TemporaryFile("w+") as trace:
            pgconn.trace(trace.fileno())
            try:
                assert _finish(next_claim, ending, result={"day": datetime.date(2026, 12, 3)})
            finally:
                pgconn.untrace()
            trace.seek(0)
            sent = [line.split("\t")[3].strip() for line in trace if line.split("\t")[1] == "F"]
        assert sum(message in ("Sync", "Query") for message in sent) == 1, sent
        (claimed,) = next_claim.runs
        assert not claimed.has_steps
        expected = Workflow.objects.get(id=queued.id)
        assert (expected.status, expected.claimed_by) == ("running", "w1")
        assert [getattr(claimed, f.attname) for f in Workflow._meta.concrete_fields] == [
            getattr(expected, f.attname) for f in Workflow._meta.concrete_fields
        ]
        assert claimed.args == [[1, 2]]
    else:
        assert _finish(next_claim, ending, result={"day": datetime.date(2026, 12, 3)})
        assert next_claim.runs is None
        assert Workflow.objects.get(id=queued.id).status == "scheduled"
    ending.refresh_from_db()
    assert (ending.status, ending.result) == ("completed", {"day": datetime.date(2026, 12, 3)})
    assert ending.completed_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_fenced_end_still_claims_and_an_empty_queue_claims_nothing():
    if database.connection().vendor != "postgresql":
        pytest.skip("the end goes with the claim on PostgreSQL only")
    theirs, (queued,) = _ended_and_waiting(claimer="w2")
    next_claim = claims.NextClaim(lambda: [theirs.id])
    assert not _finish(next_claim, theirs, "failed", error={"type": "X", "message": "m"})
    theirs.refresh_from_db()
    assert (theirs.status, theirs.claimed_by, theirs.error) == ("running", "w2", None)
    assert [run.id for run in next_claim.runs] == [queued.id]

    ours = Workflow.objects.create(name=CHAIN, args=[], status="running", claimed_by="w1")
    next_claim = claims.NextClaim(lambda: [ours.id, queued.id])
    assert _finish(next_claim, ours, "stopped")
    assert next_claim.runs == []
    assert Workflow.objects.get(id=ours.id).status == "stopped"


@pytest.mark.django_db(transaction=True)
def test_a_run_in_flight_here_is_passed_over_and_a_stopping_worker_claims_nothing():
    """A run requeued while this worker still runs it must not be claimed by it
    again; once the worker stops, the end goes alone."""
    if database.connection().vendor != "postgresql":
        pytest.skip("the end goes with the claim on PostgreSQL only")
    ending, (requeued, queued) = _ended_and_waiting(waiting=2)
    next_claim = claims.NextClaim(lambda: [ending.id, requeued.id])
    assert _finish(next_claim, ending)
    assert [run.id for run in next_claim.runs] == [queued.id]

    stopping = Workflow.objects.create(name=CHAIN, args=[], status="running", claimed_by="w1")
    next_claim = claims.NextClaim(lambda: None)
    assert _finish(next_claim, stopping)
    assert next_claim.runs is None
    assert Workflow.objects.get(id=requeued.id).status == "scheduled"


@pytest.mark.django_db(transaction=True)
def test_a_failing_claim_never_costs_the_run_its_end(monkeypatch):
    from django.db import ProgrammingError

    def broken(*args):
        raise ProgrammingError("the claim half broke")

    monkeypatch.setattr(claims, "_finish_and_claim", broken)
    ending, (queued,) = _ended_and_waiting()
    next_claim = claims.NextClaim(lambda: [ending.id])
    assert _finish(next_claim, ending, result=7)
    assert next_claim.runs is None  # the thread claims as usual
    ending.refresh_from_db()
    assert (ending.status, ending.result) == ("completed", 7)
    assert Workflow.objects.get(id=queued.id).status == "scheduled"


@pytest.mark.django_db(transaction=True)
def test_a_run_claimed_with_an_end_as_the_worker_stops_is_requeued():
    """The stop may come between a run's end with its claim and the thread's
    next turn: the run that claim took goes back to the queue, not to this thread."""
    from everystep.worker import Worker, _Slot

    worker = Worker(pool_size=1, name="w1", install_signals=False, listen=False, recover_stale_after=None)
    ended = Workflow.objects.create(name=CHAIN, args=[], status="completed", claimed_by="w1")
    taken = Workflow.objects.create(name=CHAIN, args=[], status="running", claimed_by="w1")
    slot = _Slot(worker, ended)
    worker._inflight[ended.id] = slot
    worker._stopping = True
    assert worker._take_next(slot, [taken]) is None
    taken.refresh_from_db()
    assert (taken.status, taken.claimed_by) == ("scheduled", None)
    assert not worker._inflight
