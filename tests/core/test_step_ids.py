import uuid

import pytest

from everystep import api, start_child, step, workflow
from everystep.errors import EverystepError
from everystep.models import ChildRun, Step, Workflow
from tests.core import child_workflows as cw
from tests.core import workflows as w
from tests.helpers import run_workflow

pytestmark = pytest.mark.django_db(transaction=True)


def recorded_ids(run):
    return list(run.steps.order_by("id").values_list("step_id", flat=True))


def test_sequential_steps_count_from_one():
    run = run_workflow(w.sequential, 3)
    assert run.status == "completed"
    assert recorded_ids(run) == ["1", "2", "3"]


def test_named_step_replaces_the_counter_value_which_still_advances():
    run = run_workflow(w.named)
    assert recorded_ids(run) == ["1", "second", "3"]


def test_forks_and_sequence_branches_nest_under_the_fork_id():
    run = run_workflow(w.forked)
    assert run.status == "completed", run.error
    assert sorted(recorded_ids(run)) == sorted(["1", "2.0.1", "2.1.1", "fan.0.1", "fan.0.2"])
    assert run.result == ["left", "right", (("s1", "s2"),)]


def test_nested_forks_nest_further():
    run = run_workflow(w.nested_forks)
    assert sorted(recorded_ids(run)) == ["1.0.1.0.1", "1.0.1.1.1"]


@pytest.mark.parametrize(
    "bad, problem",
    [("", "non-empty"), ("a.b", "contains '.'"), ("12", "all digits"), ("x" * 301, "limit is 300")],
)
def test_invalid_names_fail_before_the_step_runs(bad, problem):
    run = run_workflow(w.bad_name, bad)
    assert run.status == "failed"
    assert run.error["type"] == "everystep.errors.EverystepError"
    assert problem in run.error["message"]
    assert w.effects["x"] == 0
    assert recorded_ids(run) == []


def test_duplicate_name_in_one_scope_is_refused():
    @w.workflow
    def twice():
        w.record("a", everystep_id="same")
        w.record("b", everystep_id="same")

    run = run_workflow(twice)
    assert run.status == "failed"
    assert "used twice" in run.error["message"]
    assert w.effects["b"] == 0


def test_context_exposes_run_id_and_decoded_outcomes():
    run = run_workflow(w.reads_context)
    assert run.result == [str(run.id), ["1"], "one"]


def test_outside_a_run_steps_are_plain_calls_and_drop_everystep_id():
    assert w.add(1, 2, everystep_id="ignored") == 3
    assert w.forked() == ["left", "right", (("s1", "s2"),)]


def test_context_names_validation_directly():
    from everystep.context import Context, RunState

    ctx = Context(RunState("run", "wf", "me"))
    assert ctx.next_id() == "1"
    assert ctx.next_id("pay") == "pay"
    assert ctx.next_id() == "3"
    with pytest.raises(EverystepError):
        ctx.next_id("pay")


@pytest.mark.parametrize("decorator", [workflow, step])
def test_a_name_longer_than_the_name_column_is_refused_at_import(decorator):
    def make():
        return 1

    make.__qualname__ = "Namespace" + "_" * 300 + "make"
    with pytest.raises(EverystepError, match=r"the qualified name .* is 338 characters; the limit is 300"):
        decorator(make)
    columns = {model._meta.get_field("name").max_length for model in (Workflow, Step)}
    assert columns == {api.MAX_NAME_LENGTH}


async def _coroutine(x):
    return x


async def _async_generator(x):
    yield x


def _generator(x):
    yield x


@pytest.mark.parametrize("decorator", [workflow, step])
@pytest.mark.parametrize("func", [_coroutine, _async_generator, _generator])
def test_an_async_or_generator_function_is_refused_at_import(decorator, func):
    # Accepted, each run failed after its claim with "return value is not
    # serializable: a builtins.coroutine", its body never run.
    with pytest.raises(EverystepError, match="an async def or generator function cannot be a"):
        decorator(func)


def test_options_that_are_not_what_the_decorators_take_are_refused_at_import():
    # "false" read from configuration is true: every crash would park the runs blocked.
    with pytest.raises(TypeError, match="unsafe_to_repeat=.... takes True or False, not 'false'"):
        step(unsafe_to_repeat="false")
    # The expression taken for the function: it was "'str' object has no attribute '__module__'".
    with pytest.raises(TypeError, match=r"a function defined with def, not '0 9 \* \* \*'; its options"):
        workflow("0 9 * * *")



# Names Python holds apart that MySQL/MariaDB's default collation folds into one
# (case, trailing spaces, accents): migration 0017 makes the columns compare exactly.
FOLDED = [("charge", "Charge"), ("notify", "notify "), ("resume", "résumé")]


@workflow
def two_names(first, second):
    return [w.record("a", everystep_id=first), w.charge(1, everystep_id=second)]


@workflow
def two_children(first, second):
    return [str(start_child(cw.child_of, n, everystep_id=name).id) for n, name in enumerate([first, second])]


@pytest.mark.parametrize("first, second", FOLDED)
def test_names_differing_only_by_case_space_or_accent_are_two_steps(first, second):
    """Before 0017, on MySQL/MariaDB, the second step's record was taken for a
    concurrent worker's: the run was requeued for ever (an unsafe step: blocked)."""
    run = run_workflow(two_names, first, second)
    assert (run.status, run.result) == ("completed", ["a", {"charged": 1}]), run.error
    assert sorted(recorded_ids(run)) == sorted([first, second])


@pytest.mark.parametrize("first, second", FOLDED)
def test_names_differing_only_by_case_space_or_accent_start_two_children(first, second):
    run = run_workflow(two_children, first, second)
    assert run.status == "completed", run.error
    links = dict(ChildRun.objects.filter(parent_id=run.id).values_list("step_id", "child_id"))
    assert links == {first: uuid.UUID(run.result[0]), second: uuid.UUID(run.result[1])}
