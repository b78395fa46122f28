"""A schedule firing every second; its first step tells when it started."""

import time

from everystep import step, workflow


@step
def clock() -> float:
    return time.time()


@workflow(cron="* * * * * *")
def tick(slot) -> float:
    return clock()
