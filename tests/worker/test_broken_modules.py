"""A workflows module that fails to import: the worker refuses to start, and a
run claimed for a workflow whose module raises fails with that error."""

import os

import pytest
from django.test import override_settings

from everystep.api import schedule
from everystep.errors import WorkflowImportError
from everystep.models import Workflow
from everystep.worker import Worker
from tests.worker import workflows as w
from tests.worker.support import ROOT, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

S = Workflow.Status

BROKEN = """\
    from everystep import workflow

    RATES = {}
    VAT = 1 / len(RATES)
"""


def untouched(run) -> bool:
    row = Workflow.objects.get(id=run.id)
    return row.status == S.SCHEDULED and row.claimed_by is None


def test_the_worker_refuses_to_start_while_a_workflows_module_fails(settings, scratch_modules, tmp_path):
    app = scratch_modules.app(BROKEN)
    path = scratch_modules.root / app / "workflows.py"
    waiting = schedule(w.chain, str(tmp_path / "log"), 1)
    worker = Worker(pool_size=1, poll=0.05, name="w1", stop_when_idle=True)

    with (
        override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, app]),
        pytest.raises(WorkflowImportError) as refused,
    ):
        worker.run()

    assert str(refused.value) == (
        f"worker 'w1' cannot start: module '{app}.workflows' failed to import: "
        f"ZeroDivisionError: division by zero ({path}, line 4). Fix it, then start the worker again."
    )
    [failure] = refused.value.failures
    # The traceback starts in the module: importlib's frames before it say nothing.
    assert failure.traceback.splitlines()[:3] == [
        "Traceback (most recent call last):",
        f'  File "{path}", line 4, in <module>',
        "    VAT = 1 / len(RATES)",
    ]
    assert isinstance(refused.value.__cause__, ZeroDivisionError)
    assert untouched(waiting)  # it claimed nothing


@pytest.mark.slow
@pytest.mark.parametrize("skip_checks", [False, True], ids=["system-check", "worker-itself"])
def test_the_worker_command_exits_with_the_traceback(spawn_worker, scratch_modules, tmp_path, skip_checks):
    """``manage.py everystep_worker`` runs the system checks first; with
    ``--skip-checks`` the worker's own refusal still stops it."""
    app = scratch_modules.app(BROKEN)
    path = scratch_modules.root / app / "workflows.py"
    waiting = schedule(w.chain, str(tmp_path / "log"), 1)

    proc = spawn_worker(
        "refuser",
        *(["--skip-checks"] if skip_checks else []),
        extra_env={
            "DJANGO_SETTINGS_MODULE": scratch_modules.settings_with(app),
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(scratch_modules.root)]),
        },
    )

    assert proc.wait(timeout=60) == 1
    log = proc.log()
    assert f'File "{path}", line 4, in <module>\n    VAT = 1 / len(RATES)' in log  # the traceback
    if skip_checks:
        assert log.rstrip().splitlines()[-1] == (
            f"CommandError: worker 'refuser' cannot start: module '{app}.workflows' failed to import: "
            f"ZeroDivisionError: division by zero ({path}, line 4). Fix it, then start the worker again."
        )
    else:
        assert f"(everystep.E002) The workflows module '{app}.workflows' failed to import: " in log
    assert untouched(waiting)


def test_a_run_whose_module_raises_fails_with_that_error_and_the_worker_goes_on(
    scratch_modules, start_worker, tmp_path
):
    worker = start_worker(pool_size=1)
    # The module breaks after the worker started; it is imported when a run needs it.
    module = f"{scratch_modules.prefix}_flows"
    path = scratch_modules.write(
        f"{module}.py",
        """\
        import pathlib

        from everystep import workflow


        @workflow
        def flow(marker):
            pathlib.Path(marker).write_text("ran")


        raise RuntimeError("the payment gateway is not configured")
        """,
    )
    marker = tmp_path / "marker"
    broken = Workflow.objects.create(name=f"{module}.flow", args=[str(marker)])

    failed = wait_for(
        lambda: Workflow.objects.filter(id=broken.id, status=S.FAILED).first(), what="the run to fail"
    )

    assert failed.claimed_by == worker.name
    assert failed.error["type"] == "builtins.RuntimeError"
    assert failed.error["message"] == "the payment gateway is not configured"
    assert failed.error["where"] == {"module": module, "file": str(path), "line": 11}
    assert not marker.exists()  # what the module registered before it raised did not run
    healthy = schedule(w.chain, str(tmp_path / "log"), 1)
    wait_for(
        lambda: Workflow.objects.filter(id=healthy.id, status=S.COMPLETED).exists(), what="a healthy run"
    )
