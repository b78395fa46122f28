"""Workflows that start child runs, for the child-run tests."""

from everystep import sleep, start_child, step, workflow
from tests.core.workflows import charge, effect, effects, record


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


# The child workflow starts_the_chosen_child starts: a test changes it
# between a run and its re-run, as a fix deploy would.
CHOSEN = {"child": "child_of"}


@workflow
def other_child_of(n):
    return record(f"other-child:{n}")


@step
def choose_child():
    return CHOSEN["child"]


@workflow
def starts_the_chosen_child(n):
    chosen = {"child_of": child_of, "other_child_of": other_child_of}[choose_child()]
    return str(start_child(chosen, n).id)


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


@workflow
def fails(message):
    return w_boom(message)


@step
def w_boom(message):
    raise ValueError(message)


@workflow
def stops_itself(reason):
    return halts(reason)


@step
def halts(reason):
    from everystep import Terminal

    raise Terminal(reason)


@workflow
def parent_of(kind, arg):
    """Starts a child of ``kind`` and returns what its result() gave, or the
    named exception it raised (as data: the test reads the parent's result)."""
    from everystep import ChildFailed, ChildStopped

    child = {"ok": child_of, "fails": fails, "stops": stops_itself}[kind]
    handle = start_child(child, arg)
    record(f"started:{arg}")
    try:
        value = handle.result()
    except ChildFailed as exc:
        return {"raised": "ChildFailed", "child": str(exc.child_id), "error": exc.error,
                "original": type(exc.exception()).__name__}
    except ChildStopped as exc:
        return {"raised": "ChildStopped", "child": str(exc.child_id), "message": exc.error["message"]}
    record(f"got:{value}")
    return {"value": value, "child": str(handle.id)}


@step
def cancels_once_the_sibling_waits(reason):
    """Raises Terminal once the sibling branch's wait for the child halted the run."""
    from everystep import Terminal
    from everystep.context import current
    from everystep.errors import Suspended
    from tests.worker.support import wait_for

    effect("cancelling")
    state = current().state
    wait_for(lambda: isinstance(state.halt, Suspended), timeout=10, interval=0.01, what="the sibling's wait")
    raise Terminal(reason)


@workflow
def ships_unless_cancelled():
    """One branch waits for a child's result and ships it; the other branch's
    step cancels the run meanwhile. On the first pass the wait comes while the
    cancelling step is in flight; on a replay the cancelling branch lets the
    shipping one go as far as it may first (the thread timing a woken or
    resumed run can have)."""
    from everystep import parallel
    from everystep.context import current
    from tests.worker.support import wait_for

    handle = start_child(child_of, "parcel")

    def ship():
        wait_for(lambda: effects["cancelling"], timeout=10, interval=0.01, what="the cancelling step")
        return record(f"shipped:{handle.result()}")

    def cancel():
        state = current().state
        if effects["cancelling"]:  # a replay
            wait_for(
                lambda: state.halt is not None or effects["shipped:child:parcel"],
                timeout=10, interval=0.01, what="the shipping branch",
            )
        return cancels_once_the_sibling_waits("customer cancelled")

    return parallel(ship, cancel)


@workflow
def lets_the_failure_fail_it():
    return start_child(fails, "deep").result()


@workflow
def every_fenced_write(n):
    """Each kind of write a run's body makes, fenced on its claimer: a step, an
    unsafe step (its ``started`` row, then its completion), a child's start,
    a wait over at once (its ``started`` row, then its completion), and a
    wait that suspends the run."""
    record(f"step:{n}")
    charge(n)
    start_child(child_of, n)
    sleep(0)
    sleep(3600)
    return n
