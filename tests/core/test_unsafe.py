import json
import threading

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from everystep import claims, database, operations, runner
from everystep.errors import EverystepError, SimulatedCrash
from everystep.models import Workflow
from tests.core import workflows as w
from tests.helpers import CLAIMER, claim, run_once, run_workflow

pytestmark = pytest.mark.django_db(transaction=True)


def crash_after_charge():
    def fault(ctx, step_id):
        if step_id == "1":
            runner.fault = None
            raise SimulatedCrash("power cut after the charge")

    runner.fault = fault


def blocked_run(workflow=w.pays):
    crash_after_charge()
    row = run_workflow(workflow, 10)
    assert row.steps.get().status == "started"
    runner.execute(Workflow.objects.get(id=row.id), CLAIMER)  # the restarted worker
    row.refresh_from_db()
    return row


def test_uncertain_effect_blocks_the_run_instead_of_repeating_it():
    row = blocked_run()
    assert row.status == "blocked"
    assert row.error["type"] == "everystep.errors.EffectUncertain"
    assert f"everystep_resolve_step {row.id} 1" in row.error["message"]
    assert w.effects["charge:10"] == 1
    assert row.completed_at is not None


def test_completed_unsafe_step_updates_its_started_row_in_place():
    row = run_workflow(w.pays, 5)
    assert row.status == "completed"
    assert list(row.steps.values_list("step_id", "status")) == [("1", "done"), ("2", "done")]


def test_blocked_run_is_not_claimable():
    row = blocked_run()
    assert not Workflow.objects.claimable().filter(id=row.id).exists()
    assert claims.claim_runs("another-worker", 10) == []
    assert Workflow.objects.get(id=row.id).status == "blocked"


def test_an_unsafe_step_finishing_after_its_run_was_stopped_records_nothing():
    def operator_stops_during_the_effect(ctx, step_id):
        if step_id == "1":
            operations.stop_run(ctx.workflow_id, actor="alice")

    runner.fault = operator_stops_during_the_effect  # between the effect and its record
    row = run_workflow(w.pays, 6)
    assert (row.status, row.error["message"]) == ("stopped", "stopped by an operator (alice)")
    assert list(row.steps.values_list("step_id", "status")) == [("1", "started")]
    assert (w.effects["charge:6"], w.effects["shipped"]) == (1, 0)


def test_resolve_with_result_finishes_the_run_without_repeating_the_effect():
    row = blocked_run()
    operations.resolve_step(row.id, "1", result={"charged": 10})
    row.refresh_from_db()
    assert (row.status, row.error, row.claimed_by, row.completed_at) == ("scheduled", None, None, None)
    row = run_once(row)
    assert row.status == "completed" and row.result == "shipped"
    assert w.effects["charge:10"] == 1


def test_resolve_with_error_runs_the_durable_cleanup():
    row = blocked_run(w.pays_with_cleanup)
    operations.resolve_step(row.id, "1", error="card was not charged")
    row = run_once(row)
    assert row.status == "completed"
    assert row.result == "refunded: card was not charged"
    assert w.effects["refunded"] == 1


def test_resolve_error_reraised_fails_the_run_with_step_failure():
    row = blocked_run()
    operations.resolve_step(row.id, "1", error="declined")
    row = run_once(row)
    assert row.status == "failed"
    assert row.error["type"] == "everystep.errors.StepFailure"
    assert row.error["message"] == "declined"


def test_resolve_with_discard_runs_the_step_again():
    row = blocked_run()
    operations.resolve_step(row.id, "1", discard=True)
    row = run_once(row)
    assert row.status == "completed"
    assert w.effects["charge:10"] == 2


def test_step_no_longer_unsafe_is_reexecuted_and_completed_in_place():
    crash_after_charge()
    row = run_workflow(w.pays, 7)
    spec = w.charge.__everystep__
    object.__setattr__(spec, "unsafe_to_repeat", False)  # a deploy dropped the marking
    try:
        runner.execute(Workflow.objects.get(id=row.id), CLAIMER)
    finally:
        object.__setattr__(spec, "unsafe_to_repeat", True)
    row.refresh_from_db()
    assert row.status == "completed" and row.result == "shipped"
    assert list(row.steps.values_list("step_id", "status")) == [("1", "done"), ("2", "done")]
    assert w.effects["charge:7"] == 2


def test_racing_claimant_cannot_run_the_effect_twice(monkeypatch):
    """Two workers replay the same run at once, both finding the store empty: the
    ``started`` insert admits one of them to the effect, the other blocks the run."""
    from everystep import statements
    from everystep.api import schedule

    run = schedule(w.pays, 3)
    claim(run)
    # Each replay loads the run's outcomes, then waits until the other has loaded
    # them too: both see no row for step 1, so both go for the started insert.
    both_loaded = threading.Barrier(2, timeout=30)
    real_load = statements.load_outcomes

    def load_then_meet(run_id):
        rows = list(real_load(run_id))
        both_loaded.wait()
        return iter(rows)

    monkeypatch.setattr(statements, "load_outcomes", load_then_meet)
    results, errors = [], []

    def replay():
        try:
            results.append(runner.execute(Workflow.objects.get(id=run.id), CLAIMER))
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            database.connection().close()

    threads = [threading.Thread(target=replay) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert w.effects["charge:3"] == 1
    row = Workflow.objects.get(id=run.id)
    # One replay wrote the run's end; the other found it moved on and wrote nothing.
    assert sorted(results, key=str) == sorted([row.status, None], key=str)
    assert row.status in {"blocked", "completed"}
    assert row.steps.get(step_id="1").status in {"started", "done"}


@pytest.mark.parametrize(
    "args, problem",
    [
        (("not-a-uuid", "1", "--discard"), "not a valid run id"),
        (("00000000-0000-7000-8000-000000000000", "1", "--discard"), "does not exist"),
        (("{run}", "9", "--discard"), "not a started step"),
        (("{run}", "1", "--result", "{not json"), "not valid JSON"),
        # Malformed everystep tags: refused, not a KeyError/ImportError/OverflowError traceback.
        (("{run}", "1", "--result", '{"$es": "uuid"}'), "not valid JSON"),
        (("{run}", "1", "--result", '{"$es": "uuid", "v": 5}'), "not valid JSON"),
        (("{run}", "1", "--result", '{"$es": "dict", "v": 5}'), "not valid JSON"),
        (("{run}", "1", "--result", '{"$es": "enum", "cls": "nope.X", "v": 1}'), "not valid JSON"),
        (("{run}", "1", "--result", '{"$es": "timedelta", "s": 1e300, "us": 0}'), "not valid JSON"),
        # A NUL character: PostgreSQL refuses it (a DataError there), refused alike everywhere.
        (("{run}", "1", "--error", "card\x00declined"), "the error message .* NUL character"),
        (("{run}", "1", "--result", '"a\\u0000b"'), "NUL character"),
        (("{run}", "1\x00", "--discard"), "the step id .* NUL character"),
    ],
)
def test_resolve_command_refuses_bad_input_and_changes_nothing(args, problem):
    row = blocked_run()
    args = [a.replace("{run}", str(row.id)) for a in args]
    with pytest.raises(CommandError, match=problem):
        call_command("everystep_resolve_step", *args)
    row.refresh_from_db()
    assert row.status == "blocked"
    assert row.steps.get().status == "started"


def test_resolve_command_result_calls_no_function(tmp_path):
    """--result is a JSON value: an ``enum`` tag naming any callable is refused,
    not imported and called (os.mkdir here; os.system would run a command)."""
    row = blocked_run()
    target = tmp_path / "made-by-resolve"
    value = json.dumps({"$es": "enum", "cls": "os.mkdir", "v": str(target)})
    with pytest.raises(CommandError, match="not valid JSON"):
        call_command("everystep_resolve_step", str(row.id), "1", "--result", value)
    assert not target.exists()
    assert Workflow.objects.get(id=row.id).status == "blocked"


def test_resolve_refuses_a_run_that_is_not_blocked():
    row = run_workflow(w.pays, 1)
    with pytest.raises(EverystepError, match="is completed, not blocked"):
        operations.resolve_step(row.id, "1", result=1)


def test_resolve_refuses_a_step_that_is_not_the_started_one():
    def crash_after_the_charge(ctx, step_id):
        if step_id == "2":
            runner.fault = None
            raise SimulatedCrash("power cut after the charge")

    runner.fault = crash_after_the_charge
    row = run_workflow(w.prepares_then_pays, 4)
    runner.execute(Workflow.objects.get(id=row.id), CLAIMER)  # the restarted worker blocks it
    row.refresh_from_db()
    assert row.status == "blocked"
    steps_before = list(row.steps.values_list("step_id", "status", "result", "error"))
    assert [step[:2] for step in steps_before] == [("1", "done"), ("2", "started")]
    for resolution in ({"result": "forged"}, {"error": "forged"}, {"discard": True}):
        with pytest.raises(EverystepError, match=r"step '1' is not a started step .*started steps: 2\)"):
            operations.resolve_step(row.id, "1", **resolution)
    row.refresh_from_db()
    assert (row.status, row.error["type"]) == ("blocked", "everystep.errors.EffectUncertain")
    assert list(row.steps.values_list("step_id", "status", "result", "error")) == steps_before


def test_resolve_command_records_a_result(capsys):
    row = blocked_run()
    call_command("everystep_resolve_step", str(row.id), "1", "--result", '{"charged": 10}')
    assert "resolved" in capsys.readouterr().out
    assert row.steps.get().result == {"charged": 10}
    assert Workflow.objects.get(id=row.id).status == "scheduled"
