"""System checks with stable ids (``everystep.E0xx`` / ``everystep.W0xx``)."""

from django.conf import settings
from django.core import checks
from django.db import connections

SUPPORTED_VENDORS = {"postgresql", "mysql", "sqlite"}


@checks.register(checks.Tags.database)
def check_database_vendor(app_configs, databases=None, **kwargs):
    errors = []
    for alias in databases or []:
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
def check_sqlite_concurrency(app_configs, **kwargs):
    """A worker and the web process share an SQLite file only with WAL and a busy timeout."""
    db = settings.DATABASES.get("default", {})
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
                "Set DATABASES['default']['OPTIONS'] = {'init_command': "
                "'PRAGMA journal_mode=WAL;', 'transaction_mode': 'IMMEDIATE', 'timeout': 20}."
            ),
            id="everystep.W001",
        )
    ]
