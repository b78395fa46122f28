"""Shared by the benchmarks: Django set-up on a fresh PostgreSQL database, and medians."""

import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup(fresh: bool = True) -> None:
    """Create (or empty) the benchmark database, migrate it, and load Django."""
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django
    import psycopg
    from django.conf import settings

    db = settings.DATABASES["default"]
    admin = psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"],
                            dbname="postgres", autocommit=True)
    exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]).fetchone()
    if fresh and exists:
        admin.execute(f'DROP DATABASE "{db["NAME"]}" WITH (FORCE)')
        exists = None
    if not exists:
        admin.execute(f'CREATE DATABASE "{db["NAME"]}"')
    admin.close()
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def median(values) -> float:
    return statistics.median(values)


def table(rows, headers) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [line.format(*headers), line.format(*("-" * w for w in widths))]
    out += [line.format(*map(str, row)) for row in rows]
    return "\n".join(out)
