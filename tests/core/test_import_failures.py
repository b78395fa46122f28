"""A module of workflows that fails to import: the run records that error, not a missing name."""

import pytest

from everystep import registry
from everystep.models import Workflow
from tests.helpers import run_once

pytestmark = pytest.mark.django_db(transaction=True)

# A workflow that would leave a mark, defined before the line that raises.
HALF_IMPORTED = """\
    import pathlib

    from everystep import workflow


    @workflow
    def flow(marker):
        pathlib.Path(marker).write_text("ran")


    raise RuntimeError("the payment gateway is not configured")
"""


def run_of(name: str, *args) -> Workflow:
    return run_once(Workflow.objects.create(name=name, args=list(args)))


def test_a_run_whose_module_raises_fails_with_that_error_and_where(scratch_modules, tmp_path):
    module = f"{scratch_modules.prefix}_flows"
    path = scratch_modules.write(f"{module}.py", HALF_IMPORTED)
    marker = tmp_path / "marker"

    row = run_of(f"{module}.flow", str(marker))

    assert row.status == Workflow.Status.FAILED
    assert row.error == {
        "type": "builtins.RuntimeError",
        "message": "the payment gateway is not configured",
        "args": ["the payment gateway is not configured"],
        "where": {"module": module, "file": str(path), "line": 11},
    }
    # The workflow the module registered before it raised never runs.
    assert not marker.exists()
    assert f"{module}.flow" not in registry.workflow_names()


def test_an_import_error_inside_the_module_is_its_failure(scratch_modules):
    module = f"{scratch_modules.prefix}_flows"
    missing = f"{scratch_modules.prefix}_not_installed"
    path = scratch_modules.write(
        f"{module}.py",
        f"""\
        from everystep import workflow
        import {missing}
        """,
    )

    row = run_of(f"{module}.flow")

    assert row.status == Workflow.Status.FAILED
    assert row.error["type"] == "builtins.ModuleNotFoundError"
    assert row.error["message"] == f"No module named {missing!r}"
    assert row.error["where"] == {"module": module, "file": str(path), "line": 2}


def test_a_syntax_error_is_located_at_the_bad_line(scratch_modules):
    module = f"{scratch_modules.prefix}_flows"
    path = scratch_modules.write(f"{module}.py", "from everystep import workflow\n\n\ndef flow(:\n    pass\n")

    row = run_of(f"{module}.flow")

    assert row.error["type"] == "builtins.SyntaxError"
    assert row.error["where"] == {"module": module, "file": str(path), "line": 4}


def test_a_broken_package_above_the_module_is_the_one_named(scratch_modules):
    package = f"{scratch_modules.prefix}_pkg"
    init = scratch_modules.write(f"{package}/__init__.py", "settings = {}\nsettings['region']\n")
    scratch_modules.write(f"{package}/flows.py", "from everystep import workflow\n")

    row = run_of(f"{package}.flows.flow")

    assert row.error["type"] == "builtins.KeyError"
    assert row.error["where"] == {"module": package, "file": str(init), "line": 2}


@pytest.mark.parametrize("module_exists", [True, False], ids=["module-without-it", "no-such-module"])
def test_a_name_no_module_defines_keeps_the_not_registered_error(scratch_modules, module_exists):
    module = f"{scratch_modules.prefix}_flows"
    if module_exists:
        scratch_modules.write(
            f"{module}.py",
            """\
            from everystep import workflow


            @workflow
            def other():
                return 1
            """,
        )

    row = run_of(f"{module}.flow")

    assert row.status == Workflow.Status.FAILED
    assert row.error["type"] == "everystep.errors.EverystepError"
    message = row.error["message"]
    assert f"no @workflow is registered as '{module}.flow' (was it renamed or removed?)" in message
    assert "where" not in row.error


def test_once_the_module_is_fixed_its_runs_run(scratch_modules, tmp_path):
    module = f"{scratch_modules.prefix}_flows"
    scratch_modules.write(f"{module}.py", HALF_IMPORTED)
    marker = tmp_path / "marker"
    assert run_of(f"{module}.flow", str(marker)).status == Workflow.Status.FAILED

    scratch_modules.write(f"{module}.py", HALF_IMPORTED.replace("    raise RuntimeError", "    # raise"))
    row = run_of(f"{module}.flow", str(marker))

    assert row.status == Workflow.Status.COMPLETED, row.error
    assert marker.read_text() == "ran"
    assert registry.import_failure(f"{module}.flow") is None
