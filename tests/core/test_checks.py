"""everystep's system checks: a ``workflows`` module that fails to import (everystep.E002)."""

import os
import signal
import socket
import subprocess
import sys

import pytest
from django.apps import apps
from django.test import override_settings

from everystep.checks import check_workflow_modules
from tests.worker.support import ROOT, database_env, wait_for

BROKEN = """\
    from everystep import workflow

    RATES = {}
    VAT = 1 / len(RATES)
"""


def installed_with(settings, app: str):
    return override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, app])


def test_the_test_settings_pass():
    assert check_workflow_modules(None) == []


def test_a_workflows_module_that_raises_is_an_error_naming_it(settings, scratch_modules):
    app = scratch_modules.app(BROKEN)
    path = scratch_modules.root / app / "workflows.py"
    with installed_with(settings, app):
        errors = check_workflow_modules(None)
    assert [error.id for error in errors] == ["everystep.E002"]
    message = errors[0].msg
    assert message.startswith(
        f"The workflows module '{app}.workflows' failed to import: "
        f"ZeroDivisionError: division by zero ({path}, line 4)."
    )
    assert f'File "{path}", line 4, in <module>\n    VAT = 1 / len(RATES)' in message  # the traceback
    assert "Fix the error" in errors[0].hint


def test_a_missing_import_inside_a_workflows_module_is_an_error(settings, scratch_modules):
    missing = f"{scratch_modules.prefix}_not_installed"
    app = scratch_modules.app(f"import {missing}\n")
    with installed_with(settings, app):
        errors = check_workflow_modules(None)
    assert [error.id for error in errors] == ["everystep.E002"]
    assert f"ModuleNotFoundError: No module named {missing!r}" in errors[0].msg


def test_an_app_without_a_workflows_module_is_fine(settings, scratch_modules):
    app = f"{scratch_modules.prefix}_plain"
    scratch_modules.write(f"{app}/__init__.py", "")
    with installed_with(settings, app):
        assert check_workflow_modules(None) == []


def test_only_the_apps_asked_about_are_reported(settings, scratch_modules):
    app = scratch_modules.app(BROKEN)
    with installed_with(settings, app):
        assert check_workflow_modules([apps.get_app_config("everystep")]) == []
        assert len(check_workflow_modules([apps.get_app_config(app)])) == 1


def environment_with(scratch_modules, app: str) -> dict:
    """A ``manage.py`` subprocess's environment: the test database, ``app`` installed."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": scratch_modules.settings_with(app),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(scratch_modules.root)]),
        **database_env(),
    }


@pytest.mark.django_db(transaction=True)  # names the test database, holds no lock on it
@pytest.mark.parametrize("command", [["check"], ["migrate", "--plan"]])
def test_manage_py_check_and_migrate_report_it(scratch_modules, command):
    app = scratch_modules.app(BROKEN)
    result = subprocess.run(
        [sys.executable, "-m", "django", *command],
        cwd=ROOT,
        env=environment_with(scratch_modules, app),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert f"(everystep.E002) The workflows module '{app}.workflows' failed to import" in result.stderr
    assert "ZeroDivisionError: division by zero" in result.stderr
    assert "VAT = 1 / len(RATES)" in result.stderr  # the traceback
    assert "Operations to perform" not in result.stdout  # migrate stopped before the database


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_runserver_reports_it_and_restarts_once_the_module_is_fixed(scratch_modules, tmp_path):
    app = scratch_modules.app(BROKEN)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    output = tmp_path / "runserver.log"
    with open(output, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=environment_with(scratch_modules, app),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the reloader runs the server in a child: stop both
        )
    try:
        wait_for(lambda: "(everystep.E002)" in output.read_text(), what="the check error")
        # "Starting development server at" (Django 5.2), "Starting WSGI development server at" (6.x)
        assert "development server at" not in output.read_text()

        def fixed_and_restarted():
            # Saved again until the reloader notices: its first look at the file
            # may come after the first save.
            scratch_modules.write(f"{app}/workflows.py", "from everystep import workflow\n")
            return "development server at" in output.read_text()

        wait_for(fixed_and_restarted, timeout=60, interval=0.5, what="the reloader to restart the server")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
