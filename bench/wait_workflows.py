"""Workflows of the waits benchmark: each tells when it resumed after its wait."""

import time

from everystep import sleep, step, wait_for_event, workflow


@step
def resumed_at() -> float:
    return time.time()


@workflow
def sleeper(seconds: float) -> float:
    sleep(seconds)
    return resumed_at()


@workflow
def listener() -> float:
    wait_for_event("go")
    return resumed_at()


@workflow
def quick() -> float:
    return resumed_at()
