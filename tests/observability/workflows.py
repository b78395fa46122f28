"""Workflows the observability tests run, on top of tests.core.workflows."""

import enum

from everystep import parallel, start_child, step, workflow
from tests.core.child_workflows import child_of
from tests.core.workflows import boom, record


@workflow
def branch_fails():
    record("before")
    parallel(lambda: boom("in a branch"), lambda: record("healthy"))


@workflow
def nested_fork():
    return parallel(lambda: parallel(lambda: record("deep"), lambda: record("deep2")), lambda: record("top"))


class Shade(enum.Enum):
    LIGHT = 1


@step
def pick_shade():
    return Shade.LIGHT


@step
def after_the_pick(shade):
    return shade.value


@workflow
def picks_a_shade():
    return after_the_pick(pick_shade())


@workflow
def starts_children_in_branches():
    first, second = parallel(lambda: start_child(child_of, 1), lambda: start_child(child_of, 2))
    return [str(first.id), str(second.id)]
