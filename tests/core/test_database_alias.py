"""EVERYSTEP_DATABASE: everystep's tables in a database of their own, the
project's tables in ``default``. The suite runs whole in that layout with
``EVERYSTEP_TEST_SPLIT=1`` (CI does, on PostgreSQL): everystep's tables then
do not exist in ``default`` at all, so any engine or UI query sent there fails.
The tests here check the layout itself, the transaction rule and the checks."""

import sys
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.core.checks import run_checks
from django.db import connections, transaction
from django.test import override_settings

from everystep import checks, database, history, operations
from everystep.api import schedule
from everystep.models import RunFork, Workflow
from everystep.worker import Worker
from tests.core import workflows as w
from tests.core.test_unsafe import blocked_run
from tests.helpers import run_once, run_workflow

split_only = pytest.mark.skipif(
    "'engine' not in settings.DATABASES",
    reason="everystep's tables are in 'default' here: run with EVERYSTEP_TEST_SPLIT=1",
)
pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def ids(errors) -> list[str]:
    return [error.id for error in errors]


def test_an_unknown_alias_is_a_check_error():
    with override_settings(EVERYSTEP_DATABASE="jobs"):
        errors = checks.check_everystep_database(None)
    assert ids(errors) == ["everystep.E003"]
    assert "'jobs'" in errors[0].msg


@pytest.mark.parametrize(
    "setting, check_id",
    [
        ("EVERYSTEP_DATABASE", "everystep.E003"),
        ("EVERYSTEP_LISTEN_DATABASE", "everystep.E010"),
        ("EVERYSTEP_UI_READ_DATABASE", "everystep_ui.E003"),
    ],
)
@pytest.mark.parametrize("value", [["default"], {"alias": "default"}])
def test_an_alias_setting_written_as_a_list_or_a_dict_is_named_by_its_check(setting, check_id, value):
    # Not "unhashable type" from inside the checks, which stopped every command that runs them.
    with override_settings(**{setting: value}):
        found = [error for error in run_checks() if (error.id or "").startswith("everystep")]
    assert [(error.id, f"{setting} " in error.msg) for error in found] == [(check_id, True)]
    assert repr(value) in found[0].msg


def test_the_test_settings_pass_the_checks():
    assert checks.check_everystep_database(None) == []


@split_only
def test_migrating_everystep_into_default_too_is_a_check_warning():
    with override_settings(DATABASE_ROUTERS=[]):
        errors = checks.check_everystep_database(None)
    assert ids(errors) == ["everystep.W002"]
    assert "everystep.routers.EverystepRouter" in errors[0].hint


class OnlyOurApps:
    """A project's router: migrations of the project's own apps only."""

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        return app_label in {"auth", "contenttypes", "sessions", "admin"}


def test_a_router_that_never_migrates_everystep_into_its_database_is_reported():
    # migrate would never create everystep_workflow there: every query fails with "no such table".
    with override_settings(DATABASE_ROUTERS=[OnlyOurApps()]):
        found = [error for error in run_checks() if (error.id or "").startswith("everystep.")]
    assert ids(found) == ["everystep.E008"]
    assert repr(database.alias()) in found[0].msg
    assert "everystep.routers.EverystepRouter" in found[0].hint


def tables(alias: str) -> set[str]:
    with connections[alias].cursor() as cursor:
        return set(connections[alias].introspection.table_names(cursor))


@split_only
def test_everystep_tables_live_only_in_their_database():
    assert {"everystep_workflow", "everystep_step"} <= tables("engine")
    assert not {"everystep_workflow", "everystep_step"} & tables("default")
    assert "auth_user" in tables("default") and "auth_user" not in tables("engine")


@split_only
def test_a_run_goes_from_schedule_to_its_end_in_the_engine_database():
    with transaction.atomic(using=database.alias()):
        run = schedule(w.three_steps)
    Worker(pool_size=2, poll=0.05, name="split", install_signals=False, stop_when_idle=True).run()
    done = Workflow.objects.using("engine").get(id=run.id)
    assert (done.status, done.result) == ("completed", ["a", "b", "c"])
    assert done.steps.count() == 3


@split_only
def test_schedule_joins_a_transaction_on_the_engine_database_only():
    with pytest.raises(RuntimeError), transaction.atomic(using=database.alias()):
        schedule(w.three_steps)
        raise RuntimeError("rolled back")
    assert not Workflow.objects.exists()
    # A transaction on the project's database does not cover everystep's insert.
    with pytest.raises(RuntimeError), transaction.atomic(using="default"):
        schedule(w.three_steps)
        raise RuntimeError("rolled back")
    assert Workflow.objects.count() == 1


@split_only
def test_an_operator_action_writes_the_run_there_and_its_audit_trail_in_default(admin_client):
    run = schedule(w.three_steps)
    response = admin_client.post(
        f"/admin/everystep/workflow/{run.id}/run/stop/", {"seen_status": "scheduled"}
    )
    assert response.status_code == 302
    assert Workflow.objects.get(id=run.id).status == "stopped"
    assert LogEntry.objects.using("default").filter(object_id=str(run.id)).exists()


@split_only
def test_transitions_reach_the_engine_database():
    run = schedule(w.three_steps)
    operations.stop_run(run.id, actor="ops")
    assert Workflow.objects.using("engine").get(id=run.id).status == "stopped"


class ProjectRouter:
    """A project's own router in the style of Django's docs: every read and
    write of the project goes to 'default'. everystep's transitions go to
    EVERYSTEP_DATABASE whatever it says (docs/databases.md)."""

    def db_for_read(self, model, **hints):
        return "default"

    def db_for_write(self, model, **hints):
        return "default"


@split_only
def test_discarding_a_blocked_step_ignores_the_project_router():
    row = blocked_run()
    assert row.status == "blocked"
    with override_settings(DATABASE_ROUTERS=[ProjectRouter()]):
        operations.resolve_step(row.id, "1", discard=True)
    assert not Workflow.objects.get(id=row.id).steps.filter(step_id="1").exists()
    row = run_once(row)
    assert row.status == "completed"
    assert w.effects["charge:10"] == 2


@split_only
def test_forking_a_run_ignores_the_project_router():
    row = run_workflow(w.three_steps)
    assert row.status == "completed"
    with override_settings(DATABASE_ROUTERS=[ProjectRouter()]):
        fork, _ = history.fork_from_step(row.id, "2")
    assert RunFork.objects.filter(run_id=fork.id, origin_id=row.id).exists()


def test_a_listen_database_that_is_no_alias_is_a_check_error():
    with override_settings(EVERYSTEP_LISTEN_DATABASE="direct"):
        errors = checks.check_listen_database(None)
    assert ids(errors) == ["everystep.E010"]
    assert "'direct'" in errors[0].msg and "EVERYSTEP_LISTEN_DATABASE" in errors[0].msg


def test_a_listen_database_that_is_not_postgresql_is_a_check_error(monkeypatch):
    # Only the check reads it (overriding DATABASES would reach the connections).
    monkeypatch.setitem(settings.DATABASES, "direct", {"ENGINE": "django.db.backends.sqlite3", "NAME": "x"})
    with override_settings(EVERYSTEP_LISTEN_DATABASE="direct"):
        errors = checks.check_listen_database(None)
    assert ids(errors) == ["everystep.E011"]
    assert "django.db.backends.sqlite3" in errors[0].msg


def test_a_postgresql_listen_database_passes_the_check(monkeypatch):
    monkeypatch.setitem(settings.DATABASES, "direct", {"ENGINE": "django.db.backends.postgresql"})
    with override_settings(EVERYSTEP_LISTEN_DATABASE="direct"):
        assert checks.check_listen_database(None) == []
    assert checks.check_listen_database(None) == []  # unset


def test_a_listen_database_on_a_backend_built_on_postgresqls_passes_the_check(monkeypatch):
    # PostGIS (django.contrib.gis.db.backends.postgis, which needs GDAL here)
    # and django-tenants subclass Django's PostgreSQL backend: vendor
    # "postgresql", as the worker tests before it LISTENs.
    class DatabaseWrapper(connections["default"].__class__):
        vendor = "postgresql"

    backend = SimpleNamespace(DatabaseWrapper=DatabaseWrapper)
    monkeypatch.setitem(sys.modules, "geo_project.backends.base", backend)
    monkeypatch.setitem(settings.DATABASES, "direct", {"ENGINE": "geo_project.backends"})
    with override_settings(EVERYSTEP_LISTEN_DATABASE="direct"):
        assert checks.check_listen_database(None) == []


def test_only_everysteps_own_database_must_be_a_supported_backend(monkeypatch):
    # migrate checks the database it is given, test every alias: a project's
    # own tables on Oracle, everystep's on PostgreSQL, is a valid layout.
    vendors = {"default": SimpleNamespace(vendor="oracle"), "jobs": SimpleNamespace(vendor="postgresql")}
    monkeypatch.setattr(checks, "connections", vendors)
    monkeypatch.setitem(settings.DATABASES, "jobs", dict(settings.DATABASES["default"]))
    with override_settings(EVERYSTEP_DATABASE="jobs"):
        assert checks.check_database_vendor(None, databases=["default", "jobs"]) == []
        vendors["jobs"].vendor = "oracle"
        assert ids(checks.check_database_vendor(None, databases=["default", "jobs"])) == ["everystep.E001"]
