"""Retake the UI screenshots in docs/images/ from the real demo.

Runs ``scripts/demo`` on a fresh SQLite database in a temporary directory and
a free port, waits until the seeded runs have settled while the slow
``nightly_report`` run is still running (so the pages show every status and a
live runner), then logs in as admin / admin in Debian's headless Chromium,
driven by Playwright, and saves:

- ``run-list.png``: the run list;
- ``run-detail.png``: a completed ``fan_out`` run with the panel of step
  ``fulfil.1.1`` open;
- ``overview.png``: the overview page.

Use ``./scripts/screenshots``, which installs what this needs first.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 900}
WIDE_VIEWPORT = {"width": 1680, "height": 900}
DEMO = "demo_project.demo.workflows"


def main() -> int:
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)", file=sys.stderr)
        return 1
    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="everystep-screenshots-") as tmp:
        database = Path(tmp) / "demo.sqlite3"
        log = Path(tmp) / "demo.log"
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        demo = start_demo(database, port, log)
        try:
            wait_for_server(base, demo, log)
            run_id, step_pk = wait_for_settled_runs(database)
            take_screenshots(base, run_id, step_pk)
        finally:
            stop_demo(demo)
    for name in ("run-list.png", "run-detail.png", "overview.png"):
        print(f"wrote {IMAGES / name}")
    return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_demo(database: Path, port: int, log: Path) -> subprocess.Popen:
    """``scripts/demo`` exactly as a user runs it, on its own database and port."""
    env = {**os.environ, "DEMO_DATABASE": str(database), "DEMO_ADDR": f"127.0.0.1:{port}"}
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(ROOT / "scripts" / "demo")], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def wait_for_server(base: str, demo: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    """Until the demo answers HTTP (its first start installs packages, hence the long timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if demo.poll() is not None:
            raise SystemExit(f"the demo exited with status {demo.returncode}:\n{log.read_text()}")
        try:
            urllib.request.urlopen(f"{base}/admin/login/", timeout=2).close()
            return
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    raise SystemExit(f"the demo did not answer on {base} within {timeout:.0f} s:\n{log.read_text()}")


def wait_for_settled_runs(database: Path, timeout: float = 45) -> tuple[str, int]:
    """Until nothing is scheduled and only the slow report is still running;
    returns a completed fan_out run's id and the primary key of its step
    ``fulfil.1.1``.

    Reads the demo's database with the ORM, before the browser starts (Django
    refuses ORM calls from the thread that runs Playwright's event loop)."""
    os.environ["DEMO_DATABASE"] = str(database)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.db import connection

    from everystep.models import Step, Workflow

    Status = Workflow.Status
    deadline = time.monotonic() + timeout
    while True:
        runs = list(Workflow.objects.values_list("name", "status"))
        running = [name for name, status in runs if status == Status.RUNNING]
        waiting = [name for name, status in runs if status == Status.SCHEDULED]
        if runs and not waiting and running == [f"{DEMO}.nightly_report"]:
            break
        if time.monotonic() > deadline:
            raise SystemExit(
                f"the demo's runs did not settle within {timeout:.0f} s: "
                f"{len(waiting)} scheduled, running: {running or 'none'}"
            )
        time.sleep(0.5)
    step = Step.objects.filter(
        workflow__name=f"{DEMO}.fan_out", workflow__status=Status.COMPLETED, step_id="fulfil.1.1"
    ).first()
    if step is None:
        raise SystemExit("no completed fan_out run: the demo's seed changed, update docs/screenshots.py")
    connection.close()
    return str(step.workflow_id), step.pk


def take_screenshots(base: str, run_id: str, step_pk: int) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            # The admin's navigation sidebar closed, as its toggle leaves it: the pages get the width.
            page.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
            page.goto(f"{base}/admin/login/")
            page.fill("#id_username", "admin")
            page.fill("#id_password", "admin")
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/")

            def open_page(path: str) -> None:
                """A run page or the overview, once htmx (which loads their live parts) is up."""
                page.goto(f"{base}{path}")
                page.wait_for_function("() => window.htmx !== undefined")

            # The run list has nine columns: wide enough to show them all without scrolling.
            page.set_viewport_size(WIDE_VIEWPORT)
            page.goto(f"{base}/admin/everystep/workflow/")  # the admin's changelist: no htmx
            page.locator("#result_list").wait_for()
            page.screenshot(path=str(IMAGES / "run-list.png"), full_page=True)
            page.set_viewport_size(VIEWPORT)

            open_page(f"/admin/everystep/workflow/{run_id}/run/")
            panel = page.locator(f"#es-step-{step_pk}")
            panel.locator("summary").click()
            panel.locator(".es-step-payloads").wait_for()
            page.screenshot(path=str(IMAGES / "run-detail.png"), full_page=True)

            open_page("/admin/everystep/workflow/overview/")
            page.locator(".es-runners").wait_for()
            page.screenshot(path=str(IMAGES / "overview.png"), full_page=True)
        finally:
            browser.close()


def stop_demo(demo: subprocess.Popen) -> None:
    """Ctrl-C, as a user stops it (the embedded worker drains), then a kill if it hangs."""
    if demo.poll() is not None:
        return
    demo.send_signal(signal.SIGINT)
    try:
        demo.wait(30)
    except subprocess.TimeoutExpired:
        demo.kill()
        demo.wait()


if __name__ == "__main__":
    sys.exit(main())
