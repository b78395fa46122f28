"""Workflows that start child runs, for the child-run tests."""

from everystep import start_child, step, workflow
from tests.core.workflows import effect, record


@workflow
def child_of(n):
    return record(f"child:{n}")


@workflow
def starts_one_child(n):
    handle = start_child(child_of, n)
    record(f"after-start:{n}")
    return str(handle.id)


@workflow
def starts_two_children():
    first = start_child(child_of, 1)
    second = start_child(child_of, 2, everystep_id="second")
    return [str(first.id), str(second.id)]


@workflow
def starts_a_grandparent_chain():
    return str(start_child(starts_one_child, 7).id)


@step
def starts_inside_a_step():
    effect("inside-step")
    return start_child(child_of, 1)


@workflow
def calls_start_child_in_a_step():
    return starts_inside_a_step()


@workflow
def starts_a_plain_step_as_child():
    return start_child(record, "x")
