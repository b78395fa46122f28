"""Test settings: the database comes from the environment.

``EVERYSTEP_TEST_DATABASE_URL`` selects the backend:
``postgres://user@host:port/name``, ``mysql://user:password@host:port/name``,
or unset for SQLite (a file, so that worker threads and processes share it).

``EVERYSTEP_TEST_SPLIT=1`` keeps everystep's tables in a second database of
the same backend (alias ``engine``, ``EVERYSTEP_DATABASE``), and the
project's tables (auth, sessions, admin) in ``default``, as a project that
keeps its runs apart would. ``EVERYSTEP_TEST_ENGINE_DATABASE_URL`` names it
(worker subprocesses are given it); by default it is the first database's name
with ``_engine`` appended.
"""

import os
import tempfile
import uuid
from pathlib import Path
from urllib.parse import unquote, urlparse

import django

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "everystep-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "/static/"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def database_from_url(url: str | None) -> dict:
    if not url or url.startswith("sqlite:"):
        sqlite_dir = os.environ.get("EVERYSTEP_TEST_SQLITE_DIR", tempfile.gettempdir())
        # A worker subprocess started by a test is given the test's file by name.
        name = (url or "")[len("sqlite:///"):] or os.environ.get("EVERYSTEP_TEST_SQLITE_NAME") or str(
            Path(sqlite_dir) / f"everystep-test-{os.getpid()}.sqlite3"
        )
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": name,
            "TEST": {"NAME": name},
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
            },
        }
    parsed = urlparse(url)
    engine = {
        "postgres": "django.db.backends.postgresql",
        "postgresql": "django.db.backends.postgresql",
        "mysql": "django.db.backends.mysql",
        "mariadb": "django.db.backends.mysql",
    }[parsed.scheme]
    config = {
        "ENGINE": engine,
        "NAME": parsed.path.lstrip("/") or "everystep",
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": parsed.hostname or "",
        "PORT": str(parsed.port or ""),
    }
    # The test database gets a name of its own per test run, so that two runs
    # against one server (two developers, two checkouts) never share or drop
    # each other's database; pytest-django drops it at the end.
    config["TEST"] = {"NAME": f"test_{config['NAME']}_{_RUN_SUFFIX}"}
    if engine.endswith("mysql"):
        config["OPTIONS"] = {"charset": "utf8mb4"}
        config["TEST"].update(CHARSET="utf8mb4", COLLATION="utf8mb4_unicode_ci")
    return config


_RUN_SUFFIX = f"{os.getpid()}_{uuid.uuid4().hex[:6]}"


DATABASES = {"default": database_from_url(os.environ.get("EVERYSTEP_TEST_DATABASE_URL"))}

if os.environ.get("EVERYSTEP_TEST_SPLIT"):
    _engine_url = os.environ.get("EVERYSTEP_TEST_ENGINE_DATABASE_URL")
    if not _engine_url:
        _first = DATABASES["default"]
        if _first["ENGINE"].endswith("sqlite3"):
            _engine_url = "sqlite:///" + _first["NAME"].replace(".sqlite3", "-engine.sqlite3")
        else:
            _engine_url = os.environ["EVERYSTEP_TEST_DATABASE_URL"] + "_engine"
    DATABASES["engine"] = database_from_url(_engine_url)
    EVERYSTEP_DATABASE = "engine"
    DATABASE_ROUTERS = ["everystep.routers.EverystepRouter"]

# Worker subprocesses of the PgBouncer tests (tests/worker/test_pgbouncer.py)
# reach everystep's database through PgBouncer, their LISTEN connection straight.
if "EVERYSTEP_TEST_PREPARED_STATEMENTS" in os.environ:
    EVERYSTEP_PREPARED_STATEMENTS = os.environ["EVERYSTEP_TEST_PREPARED_STATEMENTS"] == "1"
if os.environ.get("EVERYSTEP_TEST_LISTEN_DATABASE_URL"):
    DATABASES["listen"] = database_from_url(os.environ["EVERYSTEP_TEST_LISTEN_DATABASE_URL"])
    EVERYSTEP_LISTEN_DATABASE = "listen"

# Worker subprocesses of the heartbeat tests are given short heartbeats (the
# suite itself keeps the defaults, which the other process tests rely on).
if "EVERYSTEP_TEST_HEARTBEAT_INTERVAL" in os.environ:
    EVERYSTEP_HEARTBEAT_INTERVAL = float(os.environ["EVERYSTEP_TEST_HEARTBEAT_INTERVAL"])
if "EVERYSTEP_TEST_RECOVER_STALE_AFTER" in os.environ:
    _stale_after = os.environ["EVERYSTEP_TEST_RECOVER_STALE_AFTER"]
    EVERYSTEP_RECOVER_STALE_AFTER = None if _stale_after == "None" else float(_stale_after)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "django_filters",
    "everystep",
    "everystep_ui",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

if django.VERSION >= (6, 0):  # django.tasks: everystep's backend (tests/tasks)
    TASKS = {"default": {"BACKEND": "everystep.tasks.EverystepBackend"}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"everystep": {"handlers": ["console"], "level": "WARNING"}},
}
