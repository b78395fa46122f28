"""Smoke test of an installed everystep: run by scripts/package-check with the
Python of a fresh virtualenv that holds only the wheel and its dependencies,
from a copy of this project in a temporary directory, far from the source tree.

What a new user does first: migrate, schedule a run, start a worker (a real
``manage.py everystep_worker`` process) that completes it, collectstatic, and
open the admin's run page as a superuser. Exits non-zero, naming the problem,
when any of it fails.
"""

import os
import re
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
PASSWORD = "smoke-password"


def say(message: str) -> None:
    print(f"smoke: {message}", flush=True)


def fail(message: str) -> None:
    sys.exit(f"smoke: FAILED: {message}")


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "smokesite.settings")
    import django

    django.setup()
    import everystep
    import everystep_ui

    check_installed(everystep, everystep_ui)

    from django.core.management import call_command

    call_command("check", fail_level="WARNING")
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)  # the wheel's migrations are whole
    call_command("migrate", interactive=False, verbosity=0)
    say("check, makemigrations --check and migrate passed")

    from django.contrib.auth import get_user_model
    from shop.workflows import fulfil

    from everystep import schedule
    from everystep.models import Workflow

    get_user_model().objects.create_superuser("admin", "admin@example.com", PASSWORD)
    run = schedule(fulfil, 42)
    say(f"scheduled run {run.id}")

    work_the_queue(run)
    run.refresh_from_db()
    if run.status != Workflow.Status.COMPLETED or run.result != "order 42: book, lamp":
        fail(f"run {run.id} ended {run.status} with {run.result!r}, error {run.error!r}")
    if run.steps.count() != 2:
        fail(f"run {run.id} recorded {run.steps.count()} steps, expected 2")
    say(f"a worker completed run {run.id}: {run.result!r}")

    call_command("collectstatic", interactive=False, verbosity=0)
    check_run_page(run)


def check_installed(everystep, everystep_ui) -> None:
    """The packages come from the virtualenv, not from a source tree nearby."""
    for package in (everystep, everystep_ui):
        where = Path(package.__file__).resolve()
        if "site-packages" not in where.parts:
            fail(f"{package.__name__} was imported from {where}, not from the installed wheel")
    if everystep.__version__ != version("everystep"):
        fail(f"everystep.__version__ is {everystep.__version__}, the metadata says {version('everystep')}")
    say(f"everystep {everystep.__version__} installed at {Path(everystep.__file__).parent}")


def work_the_queue(run) -> None:
    """A real worker process completes the run; SIGTERM then stops it cleanly."""
    from everystep.models import Workflow

    output = HERE / "worker.log"
    with open(output, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "everystep_worker", "--name", "smoke", "--poll", "0.1"],
            cwd=HERE,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while Workflow.objects.get(id=run.id).status in (
                Workflow.Status.SCHEDULED,
                Workflow.Status.RUNNING,
            ):
                if worker.poll() is not None:
                    fail(f"the worker exited ({worker.returncode}):\n{output.read_text()}")
                if time.monotonic() > deadline:
                    fail(f"run {run.id} did not end within 60s:\n{output.read_text()}")
                time.sleep(0.1)
        finally:
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(60)
    text = output.read_text()
    if code != 0:
        fail(f"the worker exited with {code} after SIGTERM:\n{text}")
    # Without LOGGING, the worker says what it is doing (see the README's Workers section).
    for expected in ("worker 'smoke' started:", "1 workflow: shop.workflows.fulfil", f"run {run.id} "):
        if expected not in text:
            fail(f"the worker's output lacks {expected!r}:\n{text}")
    say("the worker's output:\n    " + "\n    ".join(text.splitlines()))


def check_run_page(run) -> None:
    """The admin's run list and run page render for a superuser, and every
    stylesheet and script they reference was collected into STATIC_ROOT."""
    from django.conf import settings
    from django.test import Client
    from django.urls import reverse

    client = Client()
    if not client.login(username="admin", password=PASSWORD):
        fail("the superuser cannot log in")
    collected = set()
    for url in (
        reverse("admin:everystep_workflow_changelist"),
        reverse("admin:everystep_workflow_run", args=[run.id]),
    ):
        response = client.get(url)
        if response.status_code != 200:
            fail(f"GET {url} answered {response.status_code}")
        page = response.content.decode()
        if str(run.id)[:8] not in page:
            fail(f"GET {url} does not show run {run.id}")
        references = re.findall(r'(?:href|src)="' + re.escape(settings.STATIC_URL) + r'([^"?#]+)', page)
        missing = [name for name in references if not (Path(settings.STATIC_ROOT) / name).is_file()]
        if missing:
            fail(f"GET {url} references static files that are not in STATIC_ROOT: {missing}")
        collected.update(references)
    for app in ("everystep_ui/", "django_htmx/", "admin/"):
        if not any(name.startswith(app) for name in collected):
            fail(f"the pages reference no static file of {app.rstrip('/')}: {sorted(collected)}")
    say(f"the admin run list and run page render; their {len(collected)} static files are collected")


if __name__ == "__main__":
    main()
    say("passed")
