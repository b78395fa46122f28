"""One round of a fleet of worker processes draining runs of 10 trivial steps
(``bench.workflows.ten_steps``), as the throughput and ceiling benchmarks time
it: from the first claim (the first run seen leaving ``scheduled``, polled
every few milliseconds) to the last ``completed_at``, so that neither worker
start-up nor the scheduling itself is counted."""

import time
from collections.abc import Callable
from pathlib import Path

try:
    from bench.common import LOGDIR, connection_params, everystep_tables, start_worker, stop_workers
except ImportError:  # run as a script
    from common import LOGDIR, connection_params, everystep_tables, start_worker, stop_workers

STEPS_PER_RUN = 10
FIRST_CLAIM_SQL = (
    "SELECT extract(epoch FROM clock_timestamp())::float8, "
    "EXISTS (SELECT 1 FROM everystep_workflow WHERE status <> 'scheduled')"
)
LEFT_SQL = "SELECT count(*) FROM everystep_workflow WHERE status IN ('scheduled', 'running')"
LAST_END_SQL = "SELECT extract(epoch FROM max(completed_at))::float8 FROM everystep_workflow"


class Watch:
    """The benchmark's own connection for polling progress; it reconnects if the
    server restarts (on a shared machine someone may restart it mid-run)."""

    def __init__(self, **params):
        self.params = params
        self.conn = None
        self.losses = 0  # connections lost: the figures of such a round are suspect

    def fetchone(self, sql: str):
        import psycopg

        for attempt in range(60):
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = psycopg.connect(**self.params, autocommit=True)
                return self.conn.execute(sql).fetchone()
            except psycopg.OperationalError:
                if attempt == 59:
                    raise
                self.close()
                self.losses += 1
                time.sleep(0.5)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def reset() -> None:
    """Empty every everystep table, and close Django's connection (the workers
    and the watch have their own)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {everystep_tables()}")
    connection.close()


def fleet_round(
    runs: int,
    names: list[str],
    *,
    pool: int,
    poll: float,
    logdir: Path = LOGDIR,
    idle_first: bool = False,
    sample: Callable[[list], float] | None = None,
    scheduled: Callable[[], None] | None = None,
) -> dict:
    """Drain ``runs`` runs with one worker process of ``pool`` threads per name
    (its log: ``<logdir>/<name>.log``) and check that every run completed.

    By default the runs are scheduled first and the workers start on the full
    queue. With ``idle_first`` the workers start, and are idle (every one has
    a heartbeat, and is past its start-up claim and its LISTEN) before the runs
    are scheduled, so that what they spend from then on is the runs' alone.
    ``sample(procs)``, for example the workers' CPU time, is taken just before
    the runs are scheduled (or the workers start, by default) and once they are
    drained; the difference is returned as ``sampled``. ``scheduled()`` is
    called once the runs are scheduled, just before that transaction commits
    (so before any claim)."""
    from django.conf import settings
    from django.db import connection, transaction

    from bench.workflows import ten_steps
    from everystep import schedule
    from everystep.models import Heartbeat, Step, Workflow

    def schedule_runs() -> None:
        with transaction.atomic():
            for _ in range(runs):
                schedule(ten_steps)
            # Statistics, as autovacuum keeps them on a production queue (taken
            # here before the commit, so before any claim). With none, as right
            # after the TRUNCATE, PostgreSQL plans the claim through the status
            # index and a sort of every scheduled run, not the claim index.
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE everystep_workflow")
            if scheduled:
                scheduled()

    reset()  # a clean table for every round
    if not idle_first:
        schedule_runs()
        connection.close()
    watch = Watch(**connection_params(settings.DATABASES["default"]))
    procs = [
        start_worker(name, pool=pool, poll=poll, log=open(logdir / f"{name}.log", "w"))  # noqa: SIM115
        for name in names
    ]
    try:
        if idle_first:
            deadline = time.monotonic() + 120
            while Heartbeat.objects.filter(name__in=names).count() < len(names):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"the workers did not start; see the logs in {logdir}")
                time.sleep(0.05)
            time.sleep(0.3)  # past the start-up claim and the LISTEN
        before = sample(procs) if sample else 0.0
        if idle_first:
            schedule_runs()
        deadline = time.monotonic() + 600
        while True:  # the first claim, to within a few milliseconds
            now, claimed = watch.fetchone(FIRST_CLAIM_SQL)
            if claimed:
                first_claim = now
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"no run was claimed; see the logs in {logdir}")
            time.sleep(0.002)
        while time.monotonic() < deadline:
            (left,) = watch.fetchone(LEFT_SQL)
            if not left:
                break
            time.sleep(0.05)
        after = sample(procs) if sample else 0.0
        (last_end,) = watch.fetchone(LAST_END_SQL)
    finally:
        stop_workers(procs)
        watch.close()
    completed = Workflow.objects.filter(status="completed").count()
    steps = Step.objects.count()
    if completed != runs or steps != runs * STEPS_PER_RUN:
        raise RuntimeError(f"{completed} of {runs} runs completed, {steps} steps recorded")
    return {
        "runs": runs,
        "steps": steps,
        "seconds": last_end - first_claim,
        "connection_losses": watch.losses,
        "sampled": after - before,
    }
