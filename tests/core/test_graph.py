"""The intended structure: the ids the runtime will assign, read from the source, or why not."""

import importlib.util
import inspect
import textwrap

import pytest

from everystep.graph import IntendedGraph, intended_steps
from tests.core import graph_samples as s
from tests.helpers import run_workflow

SAMPLES = "tests.core.graph_samples"


def ids(func):
    graph = intended_steps(func)
    assert graph.reason is None, graph.reason
    return [step_id for step_id, _ in graph.steps]


def line_of(func, text):
    """The file line of the first line of ``func``'s source containing ``text``."""
    lines, start = inspect.getsourcelines(func)
    return start + next(i for i, line in enumerate(lines) if text in line)


# ---------------------------------------------------------------- straight line


def test_sequential_steps_count_from_one_with_qualified_names():
    assert intended_steps(s.sequential) == IntendedGraph(
        steps=[(str(n), f"{SAMPLES}.{name}") for n, name in [(1, "charge"), (2, "notify"), (3, "ship")]],
        forks=[],
    )


def test_named_ids_replace_the_counter_which_still_advances():
    assert ids(s.named) == ["1", "mail", "3"]


def test_an_unnamed_fork_takes_a_counter_value_and_its_branches_count_from_one():
    assert ids(s.unnamed_fork) == ["1", "2.0.1", "2.1.1", "3"]
    assert intended_steps(s.unnamed_fork).forks == ["2"]


def test_a_named_fork_and_a_sequence_branch_share_one_child_scope():
    graph = intended_steps(s.named_fork_with_sequence)
    assert graph.steps == [
        ("1", f"{SAMPLES}.notify"),
        ("fan.0.1", f"{SAMPLES}.charge"),
        ("fan.0.2", f"{SAMPLES}.notify"),
        ("fan.1.1", f"{SAMPLES}.ship"),
        ("done", f"{SAMPLES}.notify"),
    ]
    assert graph.forks == ["fan"]


def test_nested_forks_nest_their_prefixes():
    assert ids(s.nested_forks) == ["1.0.1.0.1", "1.0.1.1.1", "1.0.1.1.2", "1.1.1"]
    assert intended_steps(s.nested_forks).forks == ["1", "1.0.1"]


def test_helpers_count_in_the_callers_scope_also_as_branches():
    assert ids(s.helpers) == ["1", "2", "3", "4.0.1", "4.0.2", "4.0.3", "4.1.1", "4.1.2", "5"]


def test_step_functions_and_module_attributes_as_branches():
    graph = intended_steps(s.step_functions_as_branches)
    record = "tests.core.workflows.record"
    assert graph.steps == [
        ("1.0.1", f"{SAMPLES}.charge"),
        ("1.1.1", record),
        ("1.2.1", f"{SAMPLES}.ship"),
        ("1.2.2", f"{SAMPLES}.notify"),
        ("2", record),
    ]


def test_a_workflow_called_from_a_body_is_inlined():
    assert ids(s.inline_workflow) == ["1", "2", "3", "4", "5"]


def test_code_without_steps_between_steps_is_fine_and_arguments_run_first():
    graph = intended_steps(s.busy_expressions)
    assert graph.steps == [
        ("1", f"{SAMPLES}.charge"),
        ("2", f"{SAMPLES}.notify"),
        ("after.0.1", f"{SAMPLES}.notify"),
        ("after.1.1", f"{SAMPLES}.charge"),
    ]


def test_python_evaluation_order_decides_the_numbering():
    assert intended_steps(s.evaluation_order).steps == [
        (step_id, f"{SAMPLES}.{name}")
        for step_id, name in [
            ("1", "charge"),
            ("2", "notify"),
            ("3", "charge"),
            ("4", "notify"),
            ("5", "charge"),
            ("6", "charge"),
            ("7", "charge"),
            ("8", "charge"),
            ("fmt", "notify"),
            ("10", "charge"),
            ("11", "charge"),
            ("12.0.1", "charge"),
        ]
    ]


def test_a_nested_def_runs_its_defaults_then_its_annotations():
    assert ids(s.def_time_evaluation) == ["1", "2", "3", "4", "5", "6", "7", "8", "returns", "10"]


def test_under_the_future_import_annotations_are_strings_and_run_no_step(tmp_path):
    path = tmp_path / "future_annotations.py"
    path.write_text(
        textwrap.dedent(f"""\
            from __future__ import annotations

            from {SAMPLES} import charge, notify, ship


            def body():
                def inner(value: charge(1) = notify()) -> charge(2):
                    return value

                return ship()
            """)
    )
    spec = importlib.util.spec_from_file_location("future_annotations", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert intended_steps(module.body).steps == [("1", f"{SAMPLES}.notify"), ("2", f"{SAMPLES}.ship")]


def test_class_methods_objects_and_project_decorators_are_followed_and_empty_forks_count():
    graph = intended_steps(s.methods_and_decorators)
    assert [step_id for step_id, _ in graph.steps] == ["1", "2", "3", "4", "5", "6.0.1", "6.1.1", "9"]
    assert graph.forks == ["6", "7", "8"]


def test_the_ui_reads_the_same_pairs_as_step_ids():
    graph = intended_steps(s.unnamed_fork)
    assert graph.step_ids == graph.steps


def test_the_plain_function_gives_the_same_graph_as_the_decorated_one():
    assert intended_steps(s.helpers.__everystep__.func) == intended_steps(s.helpers)


# ---------------------------------------------------------------- fallbacks

DEPENDS = "which steps run depends on the data"
COUNT = "the number of steps depends on the data"
AT_RUN_TIME = "is only known at run time"
AS_VALUE = "is used as a value, not called: when it runs is unknown"
REFUSED_NAME = "(empty, dotted, digits or reused)"

REFUSED = [
    (s.loop, "for amount", f"a for loop with steps inside: {COUNT}"),
    (s.while_loop, "while charge", f"a while loop with steps inside: {COUNT}"),
    (s.condition, "if flag", f"an if statement with steps inside: {DEPENDS}"),
    (s.ternary, "if flag", f"a conditional expression with steps inside: {DEPENDS}"),
    (s.short_circuit, "flag and", f"an and/or expression with steps inside: {DEPENDS}"),
    (s.guarded, "try:", "a try statement with steps inside: which steps run depends on which fail"),
    (s.comprehension, "for amount", f"a comprehension with steps inside: {COUNT}"),
    (s.generator_expression, "for who", f"a comprehension with steps inside: {COUNT}"),
    (s.dynamic_id, "everystep_id=f", f"everystep_id is not a string literal: the id {AT_RUN_TIME}"),
    (s.id_from_constant, "MODULE", f"everystep_id is not a string literal: the id {AT_RUN_TIME}"),
    (s.dotted_id, "a.b", f"the runtime refuses everystep_id 'a.b' {REFUSED_NAME}"),
    (s.twice_named, "charge(2", f"the runtime refuses everystep_id 'same' {REFUSED_NAME}"),
    (s.keyword_splat, "**options", f"** arguments may carry an everystep_id: the id {AT_RUN_TIME}"),
    (s.local_alias, "pay = charge", f"charge {AS_VALUE}"),
    (s.local_call, "pay(1)", f"a call through the local name pay: the function {AT_RUN_TIME}"),
    (
        s.local_branch,
        "parallel(branch",
        f"the parallel branch branch is a local name: the function {AT_RUN_TIME}",
    ),
    (
        s.local_def_branch,
        "parallel(branch",
        f"the parallel branch branch is a local name: the function {AT_RUN_TIME}",
    ),
    (
        s.lambda_outside_parallel,
        "later = lambda",
        "a lambda that calls steps outside parallel: when it runs is unknown",
    ),
    (s.through_getattr, "getattr(other", f"a call through getattr(other, name): the function {AT_RUN_TIME}"),
    (s.starred_branches, "parallel(*", f"parallel branches passed with *: their number {AT_RUN_TIME}"),
    (s.step_as_value, "map(charge", f"charge {AS_VALUE}"),
    (s.method_as_value, "map(Billing", f"Billing.settle {AS_VALUE}"),
    (
        s.library_wrapper,
        "cached_helper()",
        "cached_helper wraps code that calls steps: how it calls it is not analysed",
    ),
    (
        s.assert_message,
        "assert charge",
        "an assert message with steps inside: it runs only if the assertion fails",
    ),
    (s.early_return, "if flag", "a return inside an if statement: the steps after it may not run"),
]


@pytest.mark.parametrize("func, line_text, reason", REFUSED, ids=[case[0].__name__ for case in REFUSED])
def test_bodies_whose_ids_depend_on_the_data_fall_back_with_the_line_and_why(func, line_text, reason):
    graph = intended_steps(func)
    assert graph == IntendedGraph(reason=f"line {line_of(func, line_text)}: {reason}")


def test_a_refusal_inside_a_helper_names_the_helper_and_its_line():
    line = line_of(s.countdown, "countdown(n - 1)")
    assert intended_steps(s.recursive).reason == (
        f"line {line} of {SAMPLES}.countdown: countdown calls itself: the depth depends on the data"
    )


def test_a_method_calling_through_self_falls_back():
    line = line_of(s.Billing.close_via_self, "self.close()")
    assert intended_steps(s.method_through_self).reason == (
        f"line {line} of {SAMPLES}.Billing.close_via_self: a call through self.close: "
        f"the method {AT_RUN_TIME}"
    )


def test_a_generator_helper_runs_its_steps_lazily():
    reason = intended_steps(s.lazy).reason
    assert reason.endswith(
        f"{SAMPLES}.generator_helper is a generator or async function: its steps run lazily"
    )


def test_missing_source_falls_back():
    namespace = {"__name__": "generated"}
    exec(compile(textwrap.dedent("def body():\n    return 1\n"), "<generated>", "exec"), namespace)
    assert intended_steps(namespace["body"]).reason == "the source of generated.body is not available"


def test_a_lambda_body_falls_back():
    graph = intended_steps(lambda: None)
    assert graph.steps == [] and "is not a plain def statement" in graph.reason


@pytest.mark.parametrize("thing", [42, len, None, "body"])
def test_it_never_raises(thing):
    assert intended_steps(thing).reason


def test_a_step_is_not_a_workflow():
    assert intended_steps(s.charge).reason == f"{SAMPLES}.charge is a step, not a workflow"


# ---------------------------------------------------------------- against the runtime


def by_scope(step_ids):
    """Ids grouped by scope, in order: branches interleave at run time, scopes do not."""
    scopes = {}
    for step_id in step_ids:
        scopes.setdefault(step_id.rpartition(".")[0], []).append(step_id)
    return scopes


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("func", list(s.STRAIGHT_ARGS), ids=lambda func: func.__name__)
def test_static_ids_are_the_ids_the_runtime_records(func):
    graph = intended_steps(func)
    run = run_workflow(func, *s.STRAIGHT_ARGS[func])
    assert run.status == "completed", run.error
    recorded = list(run.steps.order_by("id").values_list("step_id", "name"))
    assert sorted(recorded) == sorted(graph.steps)
    assert by_scope(sid for sid, _ in recorded) == by_scope(sid for sid, _ in graph.steps)
    forks_with_steps = {sid.rsplit(".", 2)[0] for sid, _ in recorded if "." in sid}
    assert forks_with_steps <= set(graph.forks)


@pytest.mark.parametrize(
    "func, seen",
    [
        (s.callable_object, "notifier"),
        (s.context_manager_object, "audited"),
        (s.property_getter, "totals.total"),
    ],
    ids=lambda value: getattr(value, "__name__", value),
)
def test_steps_run_by_an_objects_hidden_code_make_the_graph_unsure(func, seen):
    # __call__, __enter__/__exit__ and a property's getter run code that is
    # not walked: the graph claimed exact ids, missing those steps.
    reason = intended_steps(func).reason
    assert reason.endswith(f"{seen} runs code that calls steps unseen: it is not analysed"), reason


@pytest.mark.parametrize("func", [s.reads_a_setting, s.traced, s.formats, s.singleton], ids=str)
def test_hidden_code_that_calls_no_step_keeps_the_graph_exact(func):
    # Its calls through self cannot be followed: that made the graph unsure.
    assert ids(func) == ["1"]

