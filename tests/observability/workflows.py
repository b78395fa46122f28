"""Workflows the observability tests run, on top of tests.core.workflows."""

from everystep import parallel, workflow
from tests.core.workflows import boom, record


@workflow
def branch_fails():
    record("before")
    parallel(lambda: boom("in a branch"), lambda: record("healthy"))


@workflow
def nested_fork():
    return parallel(lambda: parallel(lambda: record("deep"), lambda: record("deep2")), lambda: record("top"))
