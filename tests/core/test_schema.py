"""The data model is exact: table and column names, types, lengths, constraints."""

import pytest
from django.core.management import call_command

from everystep import database
from everystep.models import Heartbeat, Step, Workflow

pytestmark = pytest.mark.django_db


def columns(table):
    with database.connection().cursor() as cursor:
        return {
            col.name: col
            for col in database.connection().introspection.get_table_description(cursor, table)
        }


def test_workflow_table_columns():
    cols = columns("everystep_workflow")
    assert set(cols) == {
        "id", "name", "args", "idempotency_key", "status", "claimed_by", "result", "error",
        "created_at", "completed_at",
    }
    lengths = {name: cols[name].display_size or cols[name].internal_size for name in
               ("name", "idempotency_key", "status", "claimed_by")}
    if database.connection().vendor != "sqlite":
        assert lengths == {"name": 300, "idempotency_key": 255, "status": 16, "claimed_by": 255}
    nullable = {name for name, col in cols.items() if col.null_ok}
    assert nullable == {"idempotency_key", "claimed_by", "result", "error", "completed_at"}


def test_idempotency_keys_have_a_binary_collation_on_mysql():
    """Migration 0016: keys compare exactly (no case, accent or space folding) in
    the unique (name, idempotency_key) index; the column's type is unchanged and
    name keeps the database's collation (the UI searches it case-insensitively)."""
    if database.connection().vendor != "mysql":
        pytest.skip("a MySQL/MariaDB collation")
    with database.connection().cursor() as cursor:
        cursor.execute(
            "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLLATION_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'everystep_workflow' "
            "AND COLUMN_NAME IN ('name', 'idempotency_key')"
        )
        cols = {name: rest for name, *rest in cursor.fetchall()}
    column_type, nullable, collation = cols["idempotency_key"]
    assert (column_type, nullable) == ("varchar(255)", "YES")
    assert collation.endswith("_bin"), collation
    assert not cols["name"][2].endswith("_bin")



def test_step_ids_event_keys_and_worker_names_have_a_binary_collation_on_mysql():
    """Migration 0017: the same collation as 0016's, for every other column in a
    unique index or a lookup whose values Python holds apart; types unchanged."""
    if database.connection().vendor != "mysql":
        pytest.skip("a MySQL/MariaDB collation")
    with database.connection().cursor() as cursor:
        cursor.execute(
            "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLLATION_NAME "
            "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND COLLATION_NAME IS NOT NULL"
        )
        cols = {(table, column): rest for table, column, *rest in cursor.fetchall()}
    exact = {
        ("everystep_step", "step_id"): ("varchar(300)", "NO"),
        ("everystep_wait", "step_id"): ("varchar(300)", "NO"),
        ("everystep_wait", "key"): ("varchar(255)", "YES"),
        ("everystep_event", "key"): ("varchar(255)", "NO"),
        ("everystep_child", "step_id"): ("varchar(300)", "NO"),
        ("everystep_heartbeat", "name"): ("varchar(255)", "NO"),
        ("everystep_workflow", "claimed_by"): ("varchar(255)", "YES"),
        ("everystep_workflow", "idempotency_key"): ("varchar(255)", "YES"),
    }
    assert {col: tuple(cols[col][:2]) for col in exact} == exact
    assert {cols[col][2] for col in exact} == {cols[("everystep_workflow", "idempotency_key")][2]}
    kept = [("everystep_workflow", "name"), ("everystep_concurrency_limit", "name"),
            ("everystep_run_fork", "origin_step_id"), ("everystep_step", "name")]
    assert not any(cols[col][2].endswith("_bin") for col in kept)


def test_worker_names_differing_only_by_case_space_or_accent_are_two_workers():
    """Before migration 0017, on MySQL/MariaDB, "we" and "We" shared one
    heartbeat, and requeueing the runs of one requeued those of the other."""
    import datetime as dt

    from django.utils import timezone

    from everystep import heartbeats, operations

    old = timezone.now() - dt.timedelta(hours=1)
    runs = {}
    for name in ("we", "We", "we ", "wé"):
        heartbeats.beat(name, hostname="h", pid=1, version="v", pool_size=1, started_at=old)
        runs[name] = Workflow.objects.create(name="x", args=[], status="running", claimed_by=name)
    assert sorted(Heartbeat.objects.values_list("name", flat=True)) == sorted(runs)
    Heartbeat.objects.filter(name="we").update(last_seen=old)
    assert operations.requeue_stale_worker("we", 60) == [runs["we"].id]
    running = Workflow.objects.filter(status="running").values_list("claimed_by", flat=True)
    assert sorted(running) == sorted(["We", "we ", "wé"])

def test_step_table_columns():
    cols = columns("everystep_step")
    assert set(cols) == {"id", "workflow_id", "step_id", "name", "args", "kwargs", "status",
                         "result", "error"}
    nullable = {name for name, col in cols.items() if col.null_ok}
    assert nullable == {"result", "error"}


def test_postgres_column_types():
    if database.connection().vendor != "postgresql":
        pytest.skip("jsonb and uuid are PostgreSQL types")
    with database.connection().cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_name IN ('everystep_workflow', 'everystep_step')"
        )
        types = {(t, c): d for t, c, d in cursor.fetchall()}
    assert types[("everystep_workflow", "id")] == "uuid"
    assert types[("everystep_workflow", "created_at")] == "timestamp with time zone"
    assert types[("everystep_step", "id")] == "bigint"
    for table, column in [("everystep_workflow", "args"), ("everystep_workflow", "result"),
                          ("everystep_workflow", "error"), ("everystep_step", "kwargs")]:
        assert types[(table, column)] == "jsonb"


def test_constraints_and_indexes():
    with database.connection().cursor() as cursor:
        wf = database.connection().introspection.get_constraints(cursor, "everystep_workflow")
        st = database.connection().introspection.get_constraints(cursor, "everystep_step")
    unique_steps = [c for c in st.values() if c["unique"] and c["columns"] == ["workflow_id", "step_id"]]
    assert unique_steps
    unique_keys = [c for c in wf.values() if c["unique"] and c["columns"] == ["name", "idempotency_key"]]
    assert unique_keys
    indexed = {tuple(c["columns"]) for c in wf.values() if c["index"] or c["unique"]}
    assert ("status",) in indexed and ("created_at",) in indexed
    fk = [c for c in st.values() if c["foreign_key"]]
    assert fk and fk[0]["foreign_key"][0] == "everystep_workflow"


def test_steps_carry_no_index_the_unique_one_already_serves():
    """(workflow_id) alone would be one more index write per recorded step."""
    with database.connection().cursor() as cursor:
        st = database.connection().introspection.get_constraints(cursor, "everystep_step")
    indexes = sorted(tuple(c["columns"]) for c in st.values() if c["index"] or c["unique"])
    assert ("workflow_id",) not in indexes
    assert ("workflow_id", "step_id") in indexes


def test_heartbeat_table_columns_and_constraint():
    cols = columns("everystep_heartbeat")
    assert set(cols) == {
        "id", "name", "hostname", "pid", "version", "pool_size", "in_flight", "executing", "started_at",
        "last_seen",
    }
    assert not any(col.null_ok for col in cols.values())
    with database.connection().cursor() as cursor:
        constraints = database.connection().introspection.get_constraints(cursor, "everystep_heartbeat")
    assert constraints["everystep_heartbeat_name_uniq"]["unique"]
    assert constraints["everystep_heartbeat_name_uniq"]["columns"] == ["name"]
    # One row per worker, read whole: no index but the primary key and the name's.
    secondary = [c for c in constraints.values() if (c["index"] or c["unique"]) and not c["primary_key"]]
    indexed = [tuple(c["columns"]) for c in secondary]
    assert indexed == [("name",)]


def test_a_worker_name_has_one_heartbeat():
    from django.db import IntegrityError
    from django.utils import timezone

    now = timezone.now()
    values = dict(hostname="h", pid=1, version="v", pool_size=1, started_at=now, last_seen=now)
    Heartbeat.objects.create(name="w1", **values)
    with pytest.raises(IntegrityError), database.atomic():
        Heartbeat.objects.create(name="w1", **values)


def test_related_name_and_cascade():
    run = Workflow.objects.create(name="x", args=[])
    Step.objects.create(workflow=run, step_id="1", name="s", status="done")
    assert run.steps.count() == 1
    run.delete()
    assert not Step.objects.exists()


def test_the_run_fork_table_links_a_fork_to_its_origin():
    """Additive: the fork's id as primary key, the origin's (nullable), the step, and an
    index for the origin's list of forks."""
    cols = columns("everystep_run_fork")
    assert set(cols) == {"run_id", "origin_id", "origin_step_id", "created_at"}
    assert {name for name, col in cols.items() if col.null_ok} == {"origin_id"}
    with database.connection().cursor() as cursor:
        constraints = database.connection().introspection.get_constraints(cursor, "everystep_run_fork")
    assert any(c["primary_key"] and c["columns"] == ["run_id"] for c in constraints.values())
    assert constraints["everystep_run_fork_origin_idx"]["columns"] == ["origin_id", "created_at"]
    targets = sorted(c["foreign_key"] for c in constraints.values() if c["foreign_key"])
    assert targets == [("everystep_workflow", "id"), ("everystep_workflow", "id")]


def test_migrations_are_complete():
    call_command("makemigrations", "everystep", "--check", "--dry-run", verbosity=0)
