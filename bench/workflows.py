"""Trivial workflows the benchmarks run."""

from everystep import step, workflow


@step
def noop(i):
    return i


@workflow
def many_steps(n):
    for i in range(n):
        noop(i)
    return n


@workflow
def ten_steps():
    for i in range(10):
        noop(i)
