"""Property: for any shape of steps, named ids, forks, sequence branches and
nested forks, the runtime records exactly the ids the spec assigns."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import run_workflow
from tests.reliability.shapes import expected_ids, shaped

names = st.one_of(st.none(), st.sampled_from(["pay", "ship", "mail", "fan", "x1"]))


def unique_names(nodes):
    """Names must be unique within a scope: drop repeats to positional ids."""
    seen, out = set(), []
    for node in nodes:
        name = node[1]
        if name is not None and name in seen:
            name = None
        seen.add(name)
        out.append([node[0], name, *node[2:]])
    return out


def shapes(depth=2):
    step_node = st.tuples(st.just("step"), names).map(list)
    if depth == 0:
        return st.lists(step_node, min_size=1, max_size=4).map(unique_names)
    inner = shapes(depth - 1)
    branch = st.one_of(
        st.tuples(st.just("one"), inner).map(list),
        st.tuples(st.just("seq"), st.lists(inner, min_size=1, max_size=2)).map(list),
    )
    fork = st.tuples(st.just("fork"), names, st.lists(branch, min_size=1, max_size=3)).map(list)
    return st.lists(st.one_of(step_node, fork), min_size=1, max_size=4).map(unique_names)


def _sequence_scopes_are_unique(shape):
    """In a sequence branch the parts share one scope: their names must not repeat."""
    for node in shape:
        if node[0] != "fork":
            continue
        for kind, body in node[2]:
            parts = body if kind == "seq" else [body]
            named = [n[1] for part in parts for n in part if n[1] is not None]
            if len(named) != len(set(named)):
                return False
            if not all(_sequence_scopes_are_unique(part) for part in parts):
                return False
    return True


@pytest.mark.django_db(transaction=True)
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(shapes().filter(_sequence_scopes_are_unique))
def test_recorded_ids_match_the_spec_for_any_shape(shape):
    run = run_workflow(shaped, shape)
    assert run.status == "completed", run.error
    recorded = sorted(run.steps.values_list("step_id", flat=True))
    assert recorded == sorted(expected_ids(shape))
