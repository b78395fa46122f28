"""With none of the extras installed, nothing of them is imported and runs work.

A subprocess, because the extras are imported in this one: a finder placed
first on ``sys.meta_path`` makes them unimportable before everystep loads.
"""

import textwrap

from tests.observability import support

SCRIPT = textwrap.dedent(
    """
    import sys

    BLOCKED = ("prometheus_client", "sentry_sdk", "opentelemetry")

    class Absent:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Absent())

    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)

    from django.test import RequestFactory

    from everystep import observability, runner
    from everystep.errors import EverystepError
    from everystep.views import metrics_view
    from tests.core import workflows as w
    from tests.helpers import run_workflow
    from tests.observability.workflows import branch_fails

    assert runner.observer is None
    assert (observability.metrics, observability.sentry, observability.tracing) == (None, None, None)
    assert run_workflow(w.three_steps).status == "completed"
    assert run_workflow(w.forked).status == "completed"
    assert run_workflow(w.failing).status == "failed"
    assert run_workflow(branch_fails).status == "failed"
    assert run_workflow(w.terminal_then_more).status == "stopped"

    # The worker's calls are no-ops; serving metrics says what to install.
    observability.worker_started("w", 4)
    observability.claimed("w", 1)
    observability.in_flight("w", 1)
    observability.requeued("w", 1)
    observability.reconnected("w")
    try:
        observability.serve_worker_metrics(0, "127.0.0.1")
    except EverystepError as exc:
        assert "everystep[metrics]" in str(exc)
    else:
        raise AssertionError("serve_worker_metrics served without prometheus-client")
    response = metrics_view(RequestFactory().get("/metrics"))
    assert response.status_code == 501 and b"everystep[metrics]" in response.content

    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    assert not loaded, loaded
    print("ok")
    """
)


def test_runs_work_and_nothing_is_imported_without_the_extras(tmp_path):
    done = support.run_script(SCRIPT, tmp_path, PYTHONWARNINGS="error")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
