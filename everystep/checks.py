"""System checks with stable ids (``everystep.E0xx`` / ``everystep.W0xx``)."""

from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, connections, router
from django.db.utils import load_backend

from . import database, heartbeats, registry, statements

SUPPORTED_VENDORS = {"postgresql", "mysql", "sqlite"}


@checks.register(checks.Tags.database)
def check_database_vendor(app_configs, databases=None, **kwargs):
    """everystep's database is one it supports. Only that one: a project's own
    tables may live on any backend (``migrate`` checks the database it is
    given, ``test`` every alias)."""
    errors = []
    for alias in databases or []:
        if alias != database.alias():
            continue
        vendor = connections[alias].vendor
        if vendor not in SUPPORTED_VENDORS:
            errors.append(
                checks.Error(
                    f"Database {alias!r} ({vendor}) is not supported by everystep workers.",
                    hint="Use PostgreSQL, MariaDB/MySQL or SQLite.",
                    id="everystep.E001",
                )
            )
    return errors


@checks.register()
def check_everystep_database(app_configs, **kwargs):
    """``EVERYSTEP_DATABASE`` names a configured alias, and ``migrate`` puts the
    tables there, and there only."""
    alias = database.alias()
    if not database.is_alias(alias):
        return [
            checks.Error(
                f"EVERYSTEP_DATABASE is {alias!r}, which is not an alias of DATABASES "
                f"({', '.join(settings.DATABASES)}).",
                hint="Set EVERYSTEP_DATABASE to the alias that holds everystep's tables.",
                id="everystep.E003",
            )
        ]
    if not router.allow_migrate(alias, "everystep", model_name="workflow"):
        # Else migrate never creates the tables there: every query fails with "no such table".
        return [
            checks.Error(
                f"EVERYSTEP_DATABASE is {alias!r}, but the routers' allow_migrate keeps the app "
                "'everystep' off it: migrate never creates everystep's tables there.",
                hint=(
                    "Put 'everystep.routers.EverystepRouter' first in DATABASE_ROUTERS, or make "
                    "your router's allow_migrate return True (or None) for the app 'everystep' on "
                    "that alias."
                ),
                id="everystep.E008",
            )
        ]
    migrates_default = router.allow_migrate(DEFAULT_DB_ALIAS, "everystep", model_name="workflow")
    if alias != DEFAULT_DB_ALIAS and migrates_default:
        return [
            checks.Warning(
                f"EVERYSTEP_DATABASE is {alias!r}, but migrate would also create everystep's "
                f"tables in {DEFAULT_DB_ALIAS!r}, where nothing uses them.",
                hint=(
                    "Add 'everystep.routers.EverystepRouter' to DATABASE_ROUTERS, or make your "
                    "router's allow_migrate keep the app 'everystep' on that alias only."
                ),
                id="everystep.W002",
            )
        ]
    return []


@checks.register()
def check_sqlite_concurrency(app_configs, **kwargs):
    """A worker and the web process share an SQLite file only with WAL and a busy timeout."""
    alias = database.alias()
    db = settings.DATABASES[alias] if database.is_alias(alias) else {}  # else E003
    if db.get("ENGINE") != "django.db.backends.sqlite3":
        return []
    options = db.get("OPTIONS", {})
    if "journal_mode=wal" in str(options.get("init_command", "")).replace(" ", "").lower():
        return []
    return [
        checks.Warning(
            "The SQLite database is not in WAL mode: a worker and the web process "
            "will see 'database is locked' errors.",
            hint=(
                f"Set DATABASES[{alias!r}]['OPTIONS'] = "
                "{'init_command': 'PRAGMA journal_mode=WAL;', 'transaction_mode': 'IMMEDIATE', "
                "'timeout': 20}."
            ),
            id="everystep.W001",
        )
    ]


@checks.register()
def check_workflow_modules(app_configs, **kwargs):
    """A ``workflows`` module that raises on import: workers refuse to start and
    its runs fail with that error."""
    failures = registry.autodiscover()
    if app_configs is not None:
        asked = {f"{app_config.name}.workflows" for app_config in app_configs}
        failures = [failure for failure in failures if failure.module in asked]
    return [
        checks.Error(
            f"The workflows {failure.summary()}. Its workflows are not registered: workers "
            f"refuse to start, and its runs fail with this error.\n{failure.traceback}",
            hint="Fix the error the traceback shows (or install what the module imports), "
            "then restart the web process and the workers.",
            id="everystep.E002",
        )
        for failure in failures
    ]


@checks.register()
def check_tasks_backend_needs_django_6(app_configs, **kwargs):
    """Django 5.2 ignores ``TASKS``: a task would run nowhere, say so."""
    import django

    if django.VERSION >= (6, 0):
        return []
    configured = [
        alias
        for alias, config in getattr(settings, "TASKS", {}).items()
        if isinstance(config, dict) and str(config.get("BACKEND", "")).startswith("everystep.tasks.")
    ]
    if not configured:
        return []
    return [
        checks.Error(
            f"TASKS[{configured[0]!r}] names everystep's Tasks backend, which needs Django 6.0 or "
            f"later (django.tasks); this is Django {django.get_version()}.",
            hint="Upgrade to Django 6, or schedule @workflow functions with everystep.schedule().",
            id="everystep.E005",
        )
    ]


@checks.register()
def check_heartbeat_settings(app_configs, **kwargs):
    """The heartbeat interval and the stale limit make sense, alone and together."""
    return [
        checks.Error(
            message,
            hint=(
                f"Leave both unset (a heartbeat every {heartbeats.DEFAULT_INTERVAL:g} s, recovery after "
                f"{heartbeats.DEFAULT_STALE_AFTER:g} s), or set EVERYSTEP_RECOVER_STALE_AFTER to at "
                f"least {heartbeats.MIN_INTERVALS} times EVERYSTEP_HEARTBEAT_INTERVAL (None turns "
                "recovery off)."
            ),
            id=check_id,
        )
        for check_id, message in heartbeats.problems(heartbeats.interval(), heartbeats.stale_after())
    ]


@checks.register()
def check_listen_database(app_configs, **kwargs):
    """``EVERYSTEP_LISTEN_DATABASE`` names a PostgreSQL alias of ``DATABASES``."""
    listen = getattr(settings, "EVERYSTEP_LISTEN_DATABASE", None)
    if listen is None:
        return []
    hint = (
        "Set EVERYSTEP_LISTEN_DATABASE to the alias of a direct connection (not through PgBouncer) "
        "to the PostgreSQL database that holds everystep's tables, or leave it unset."
    )
    if not database.is_alias(listen):
        return [
            checks.Error(
                f"EVERYSTEP_LISTEN_DATABASE is {listen!r}, which is not an alias of DATABASES "
                f"({', '.join(settings.DATABASES)}).",
                hint=hint,
                id="everystep.E010",
            )
        ]
    engine = settings.DATABASES[listen].get("ENGINE", "")
    if _vendor(engine) != "postgresql":
        return [
            checks.Error(
                f"EVERYSTEP_LISTEN_DATABASE is {listen!r}, a {engine or 'no'} database: LISTEN/NOTIFY "
                "is PostgreSQL's.",
                hint=hint,
                id="everystep.E011",
            )
        ]
    return []


@checks.register()
def check_prepare_threshold(app_configs, **kwargs):
    """Django's own statements prepared by psycopg on everystep's database: then
    each rollback there makes psycopg send ``DEALLOCATE ALL``, which behind
    PgBouncer also drops everystep's prepared statements (see
    ``statements.execute``). Django's cursors bind on the client and are never
    prepared, whatever ``prepare_threshold`` says, unless ``server_side_binding``."""
    if not statements.prepared_statements():
        return []  # everystep prepares nothing
    alias = database.alias()
    db = settings.DATABASES[alias] if database.is_alias(alias) else {}  # else E003
    options = db.get("OPTIONS") or {}
    if options.get("prepare_threshold") is None or options.get("server_side_binding") is not True:
        return []
    if _vendor(db.get("ENGINE", "")) != "postgresql":
        return []
    return [
        checks.Warning(
            f"DATABASES[{alias!r}]['OPTIONS'] sets prepare_threshold with server_side_binding: psycopg "
            "prepares Django's own statements on everystep's database, and sends DEALLOCATE ALL after "
            "each rollback there (a failed transaction.atomic() in a step). Behind PgBouncer, that also "
            "drops everystep's prepared statements: PgBouncer cuts the worker's connection off at its "
            "next statement, and the run goes back to the queue, its step run again.",
            hint=(
                "Behind PgBouncer, remove prepare_threshold from OPTIONS (Django's default, None, "
                "prepares nothing), or set EVERYSTEP_PREPARED_STATEMENTS = False. Straight to "
                "PostgreSQL a rollback costs only a statement prepared again: add 'everystep.W003' "
                "to SILENCED_SYSTEM_CHECKS."
            ),
            id="everystep.W003",
        )
    ]


@checks.register()
def check_prepared_statements_setting(app_configs, **kwargs):
    """``EVERYSTEP_PREPARED_STATEMENTS`` is True or False: a string read from the
    environment ("False") would be truthy and keep them on."""
    value = statements.prepared_statements_setting()
    if isinstance(value, bool):
        return []
    return [
        checks.Error(
            f"EVERYSTEP_PREPARED_STATEMENTS is {value!r}, not True or False.",
            hint="Set it to False behind PgBouncer before 1.21 in transaction pooling; else leave it unset.",
            id="everystep.E012",
        )
    ]


def _vendor(engine: str) -> str | None:
    """The vendor of a ``DATABASES`` ENGINE, as the worker decides by it: PostGIS
    and other backends built on Django's PostgreSQL one are "postgresql". Read
    from the backend's class, without opening a connection; None when it does
    not load (Django's own checks report that)."""
    try:
        return load_backend(engine).DatabaseWrapper.vendor
    except Exception:
        return None
