"""Workflows of bench/children.py."""

from everystep import start_child, step, workflow


@step
def tick(i):
    return i


@workflow
def leaf(i):
    return tick(i)


@workflow
def fans_out(n):
    for i in range(n):
        start_child(leaf, i)
    return n


@workflow
def ticks(n):
    for i in range(n):
        tick(i)
    return n


@workflow
def waits_for_leaf(i):
    return start_child(leaf, i).result()
