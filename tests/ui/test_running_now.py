"""The run page marks the steps running now, with a real worker process running
the run: one mark per active parallel branch, gone once a step is recorded,
and the polling stops at the end."""

import re
import signal

import pytest

from everystep.api import schedule
from everystep.models import Step, Workflow
from tests.worker import workflows as w
from tests.worker.conftest import spawn_worker  # noqa: F401  (a fixture)
from tests.worker.support import wait_for

from .conftest import HTMX

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST = {"EVERYSTEP_TEST_HEARTBEAT_INTERVAL": "0.2", "EVERYSTEP_TEST_RECOVER_STALE_AFTER": "1.5"}
RUNNING_NOW = re.compile(
    r'<code class="es-path">([^<]+)</code> <span class="es-badge es-status-executing">running now</span>'
)


def marked(client, run) -> list[str]:
    """The steps the page's live block marks as running now (an htmx poll)."""
    response = client.get(f"/admin/everystep/workflow/{run.pk}/run/", **HTMX)
    assert response.status_code == 200, response.status_code
    return RUNNING_NOW.findall(response.text)


def recorded(run, step_id) -> bool:
    return Step.objects.filter(workflow_id=run.pk, step_id=step_id).exists()


def test_the_page_follows_the_steps_a_worker_runs(admin_client, tmp_path, spawn_worker):  # noqa: F811
    log, gate_a, gate_b = (str(tmp_path / name) for name in ("log", "gate-a", "gate-b"))
    run = schedule(w.forked_gates, log, gate_a, gate_b)
    worker = spawn_worker("painter", "--poll", "0.1", extra_env=FAST)

    # Both branches wait on their gates: both are running now, step 3 later.
    wait_for(lambda: marked(admin_client, run) == ["2.0.1", "2.1.1"], what="both branches to be marked")
    page = admin_client.get(f"/admin/everystep/workflow/{run.pk}/run/").text
    assert re.search(r'<code class="es-path">3</code> <span class="es-badge es-status-pending">', page)

    open(gate_a, "w").close()
    wait_for(lambda: recorded(run, "2.0.1"), what="branch 0's step to be recorded")
    # Recorded: never marked again, even before the next heartbeat says so.
    assert "2.0.1" not in marked(admin_client, run)
    wait_for(lambda: marked(admin_client, run) == ["2.1.1"], what="only branch 1 to be marked")

    open(gate_b, "w").close()
    wait_for(lambda: Workflow.objects.get(pk=run.pk).status == "completed", what="the run to complete")
    final = admin_client.get(f"/admin/everystep/workflow/{run.pk}/run/", **HTMX)
    assert final.status_code == 286  # htmx stops polling
    assert RUNNING_NOW.findall(final.text) == [] and "es-claimer-heartbeat" not in final.text
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()
