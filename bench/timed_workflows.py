"""Workflows whose first step tells when it started (the pickup benchmark)."""

import time

from everystep import step, workflow


@step
def clock() -> float:
    return time.time()


@workflow
def stamp() -> float:
    return clock()
