"""The demo (demo_project, ./scripts/demo, docs/demo.md) as a user starts it:
manage.py in a process of its own, on a SQLite file of the test's own."""

import contextlib
import socket
import sqlite3
import subprocess
import sys

import pytest

from tests.scripts import ROOT

REQUEST = """
from django.test import Client
response = Client().get("/", HTTP_HOST={host!r})
print("STATUS", response.status_code)
"""


def manage(db, *argv, timeout=120):
    return subprocess.run(
        [sys.executable, "demo_project/manage.py", *argv], cwd=ROOT, capture_output=True, text=True,
        timeout=timeout, env={"PATH": "/usr/bin:/bin", "DEMO_DATABASE": str(db)},
    )


def seeded(tmp_path):
    """A demo database of the test's own, migrated and seeded as ./scripts/demo does."""
    db = tmp_path / "demo.sqlite3"
    for argv in (("migrate", "--noinput", "-v", "0"), ("seed_demo",)):
        done = manage(db, *argv)
        assert done.returncode == 0, done.stdout + done.stderr
    return db


def running(db) -> list:
    """The runs left ``running`` (name, claimer) in the demo's database."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT name, claimed_by FROM everystep_workflow WHERE status = 'running'")
        return rows.fetchall()


@pytest.mark.parametrize("addr", ["0.0.0.0:8000", "192.0.2.10:8000"])
def test_the_demo_answers_on_the_address_demo_addr_names(tmp_path, addr):
    """DEMO_ADDR=host:port with a host other than 127.0.0.1 or localhost (0.0.0.0
    to reach it from another machine, a VM or a container, or the machine's own
    address): the URL scripts/demo prints answers, not 400 (DisallowedHost)."""
    done = manage(tmp_path / "demo.sqlite3", "shell", "-c", REQUEST.format(host=addr))
    assert "STATUS" in done.stdout, done.stdout + done.stderr
    # The redirect to the runs list, not 400 Bad Request.
    assert "STATUS 302" in done.stdout, done.stdout + done.stderr


def test_a_demo_that_cannot_bind_its_port_leaves_no_run_claimed(tmp_path):
    """When the address is taken (a second ./scripts/demo, another dev server),
    runserver says "That port is already in use" and ends the process with
    os._exit(1): no finally runs, so a worker started before the bind would
    leave the runs it had claimed running mid-step. A demo that could not
    start must not have touched the queue."""
    db = seeded(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = manage(db, "rundemo", f"127.0.0.1:{port}", timeout=60)
    assert done.returncode != 0 and "already in use" in done.stderr, done.stdout + done.stderr
    assert running(db) == [], f"runs left running by a demo that never served: {running(db)}"


def test_a_demo_stopped_with_sigterm_drains_its_worker(tmp_path):
    """docker stop, systemd and kill send SIGTERM: the demo stops as on Ctrl-C,
    its worker drained (it was killed at once, runs left running mid-step)."""
    import signal

    from tests.worker.support import wait_for

    db = seeded(tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"PATH": "/usr/bin:/bin", "DEMO_DATABASE": str(db)}
    argv = [sys.executable, "demo_project/manage.py", "rundemo", f"127.0.0.1:{port}"]
    out = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
    demo = subprocess.Popen(argv, cwd=ROOT, env=env, text=True, **out)

    def claimed():
        with contextlib.closing(sqlite3.connect(db)) as conn:
            rows = conn.execute("SELECT count(*) FROM everystep_workflow WHERE status != 'scheduled'")
            return rows.fetchone()[0]

    try:
        wait_for(claimed, timeout=60, what="the demo's worker to claim runs")
        demo.send_signal(signal.SIGTERM)
        output = demo.communicate(timeout=60)[0]
    finally:
        demo.kill()
    assert demo.returncode == 0, output
    assert running(db) == [], f"runs left running by a demo stopped with SIGTERM: {running(db)}\n{output}"
