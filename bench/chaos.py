"""Chaos soak: worker processes on PostgreSQL execute runs while a controller
SIGKILLs and SIGTERMs them (restarting each under the same name) and restarts
PostgreSQL once. The soak starts a PostgreSQL server of its own for that
(tests/throwaway_postgres.py: a temporary cluster on a free port, removed at
the end) and touches no other server. Then it checks the durability promise
and prints figures:

- every run is terminal (none lost, none stuck);
- every recorded step is recorded exactly once and its effect happened;
- safe steps ran again only around crashes (bounded by the crashes);
- no unsafe-to-repeat effect ran twice (such runs end blocked instead);
- no two workers ran the same run at the same time;
- the restart happened (the server's start time changed) and the workers saw
  it (they logged reconnecting);
- with ``--pgbouncer``: the workers reach PostgreSQL through a PgBouncer of the
  soak's own (transaction pooling, fewer server connections than worker
  threads, prepared statements off, LISTEN straight to PostgreSQL), which is
  killed and restarted once; the workers must log reconnecting
  after that too; with ``--prepared`` as well, a PgBouncer that keeps prepared
  statements (1.21 or later) and the engine's on, the default; PgBouncer must
  not have cut a client off over its prepared statements;
- a worker SIGKILLed and never restarted: the others requeue every run it held
  within EVERYSTEP_RECOVER_STALE_AFTER plus one poll of the kill (its heartbeat
  went stale), and finish them all (the checks above cover their effects).

Exits non-zero on any violation. Usage:
    python bench/chaos.py                 # the long soak (README figures)
    python bench/chaos.py --short         # about a minute (the test suite runs this)
    python bench/chaos.py --short --pgbouncer   # the same behind PgBouncer
    python bench/chaos.py --short --pgbouncer --prepared   # PgBouncer 1.21+, prepared statements on
"""

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import exit_on_sigterm, load_django, stop_workers, table  # noqa: E402
from tests.throwaway_pgbouncer import ThrowawayPgBouncer  # noqa: E402
from tests.throwaway_postgres import ThrowawayPostgres  # noqa: E402

# What a worker logs when it reconnects: its claim loop or LISTEN connection
# ("database back after ...", "LISTEN connection back after ..."), or a run's
# thread ("database unavailable (...); reconnecting": a run's end or requeue
# retried). Behind PgBouncer with Django's connection pool, a claim loop may
# get a fresh connection without ever failing: the run threads are then the
# ones that see the cut.
RECONNECTED = (" back after ", "); reconnecting")
POLL = 0.2  # the workers' --poll
# Short heartbeats, so that the soak sees a dead worker's runs recovered soon.
HEARTBEAT_INTERVAL = 0.5
STALE_AFTER = 4.0
RESOLUTION = 0.05  # how often the controller looks for the dead worker's runs
PGBOUNCER_POOL = 3  # with --pgbouncer: its server connections


class Fleet:
    """Worker processes by name; a restarted worker keeps its name."""

    def __init__(self, count: int, pool: int, logdir: Path):
        self.pool = pool
        self.logdir = logdir
        self.procs: dict[str, subprocess.Popen] = {}
        self.kill_times: dict[int, float] = {}  # pid -> when it was SIGKILLed
        for i in range(count):
            self.start(f"chaos-{i}")

    def start(self, name: str) -> None:
        env = {
            **os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "bench.settings",
            "EVERYSTEP_BENCH_HEARTBEAT_INTERVAL": str(HEARTBEAT_INTERVAL),
            "EVERYSTEP_BENCH_RECOVER_STALE_AFTER": str(STALE_AFTER),
        }
        log = open(self.logdir / f"{name}.log", "a")  # noqa: SIM115 - kept open for the child
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "django", "everystep_worker", "--name", name,
             "--pool", str(self.pool), "--poll", str(POLL), "--drain", "10"],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
        )

    def kill(self, name: str, *, restart: bool = True) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        self.kill_times[proc.pid] = time.time()
        proc.wait()
        if restart:
            self.start(name)
        else:
            del self.procs[name]

    def term(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            self.kill_times[proc.pid] = time.time()
            proc.wait()
        self.start(name)

    def stop_all(self) -> None:
        stop_workers(self.procs.values())


def restart_postgres(server: ThrowawayPostgres, logdir: Path) -> list[str]:
    """Restart the soak's server; what went wrong with it (nothing: [])."""
    started = server.start_time()
    server.restart()
    if server.start_time() <= started:
        return ["PostgreSQL was restarted but its start time did not change"]
    # Let the workers notice before the chaos goes on, so that the next kills
    # cannot take every witness of the outage with them.
    deadline = time.time() + 60
    while time.time() < deadline:
        if _reconnects_logged(logdir):
            return []
        time.sleep(0.2)
    return ["PostgreSQL was restarted but no worker logged reconnecting within 60 s"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--short", action="store_true", help="the bounded version for the test suite")
    parser.add_argument("--workers", type=int)
    parser.add_argument("--runs", type=int)
    parser.add_argument("--chaos-seconds", type=float)
    parser.add_argument("--pool", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--pgbouncer", action="store_true",
                        help="workers behind a PgBouncer of the soak's own, restarted once")
    parser.add_argument("--prepared", action="store_true",
                        help="with --pgbouncer: one that keeps prepared statements (1.21+), the engine's on")
    args = parser.parse_args(argv)
    if args.prepared and not args.pgbouncer:
        parser.error("--prepared goes with --pgbouncer")
    exit_on_sigterm()  # a stopped soak still stops its workers and its server
    with ThrowawayPostgres() as server:
        direct = server.create_database("everystep_chaos")
        os.environ["EVERYSTEP_BENCH_DATABASE_URL"] = direct
        if not args.pgbouncer:
            return soak(server, args, None)
        # Fewer server connections than the workers have threads (pool + a claim loop each).
        with ThrowawayPgBouncer(
            "127.0.0.1", server.port, pool_size=PGBOUNCER_POOL, prepared_statements=args.prepared
        ) as bouncer:
            prepared = "on" if args.prepared else "off"
            print(f"{bouncer.version()} on port {bouncer.port}: transaction pooling, "
                  f"{PGBOUNCER_POOL} server connections, prepared statements {prepared}")
            os.environ.update(
                EVERYSTEP_BENCH_DATABASE_URL=bouncer.url("everystep_chaos"),
                EVERYSTEP_BENCH_LISTEN_DATABASE_URL=direct,
                EVERYSTEP_BENCH_PREPARED_STATEMENTS="1" if args.prepared else "0",
            )
            return soak(server, args, bouncer)


def restart_pgbouncer(bouncer: ThrowawayPgBouncer, logdir: Path) -> tuple[list[str], int]:
    """Kill the soak's PgBouncer and start it again; what went wrong (nothing: [])
    and how many reconnects the workers logged after it."""
    before = _reconnects_logged(logdir)
    bouncer.restart()
    deadline = time.time() + 60
    while time.time() < deadline:
        after = _reconnects_logged(logdir) - before
        if after:
            return [], after
        time.sleep(0.2)
    return ["PgBouncer was restarted but no worker logged reconnecting within 60 s"], 0


def soak(server: ThrowawayPostgres, args, bouncer: ThrowawayPgBouncer | None) -> int:
    workers = args.workers or (2 if args.short else 4)
    runs = args.runs or (60 if args.short else 600)
    chaos_seconds = args.chaos_seconds or (25 if args.short else 240)
    rng = random.Random(args.seed)
    load_django()  # Django on the soak's database; workers inherit it through the environment
    from django.db import connection

    from bench import chaos_workflows
    from everystep import schedule
    from everystep.models import Step, Workflow
    from everystep.registry import qualified_name
    from everystep.waits import WAIT_STEP_NAMES

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE chaos_effect (id bigserial PRIMARY KEY, run_id uuid NOT NULL, "
            "step_id text NOT NULL, unsafe boolean NOT NULL, pid integer NOT NULL, "
            "worker text NOT NULL, started double precision NOT NULL, ended double precision, "
            "value text)"
        )
    # The waiting runs first: claimed early, so that some of the events come
    # after their wait is reached.
    waits = Waits(rng, 1 if args.short else 8, chaos_seconds)
    waiting_runs = waits.schedule()
    for i in range(runs):
        schedule(chaos_workflows.mixed, chaos_workflows.KINDS[i % len(chaos_workflows.KINDS)])
    runs += waiting_runs
    connection.close()

    logdir = ROOT / "bench" / "chaos-logs"
    logdir.mkdir(exist_ok=True)
    for old in logdir.glob("chaos-*.log"):
        old.unlink()
    fleet = Fleet(workers, args.pool, logdir)
    kills = terms = pg_restarts = bouncer_restarts = bouncer_reconnects = 0
    violations = []
    started = time.time()
    pg_restart_at = started + chaos_seconds / 2
    bouncer_restart_at = started + chaos_seconds * 3 / 4
    print(f"chaos: {workers} workers x pool {args.pool}, {runs} runs, {chaos_seconds:.0f} s of chaos")
    try:
        while time.time() - started < chaos_seconds:
            time.sleep(rng.uniform(0.5, 2.5))
            name = rng.choice(sorted(fleet.procs))
            if rng.random() < 0.5:
                fleet.kill(name)
                kills += 1
            else:
                fleet.term(name)
                terms += 1
            waits.send_due()
            if not pg_restarts and time.time() >= pg_restart_at:
                violations += restart_postgres(server, logdir)
                pg_restarts += 1
            if bouncer is not None and not bouncer_restarts and time.time() >= bouncer_restart_at:
                problems, bouncer_reconnects = restart_pgbouncer(bouncer, logdir)
                violations += problems
                bouncer_restarts += 1
        waits.send_due(everything=True)
        dead = kill_for_good(fleet, args.pool, rng)
        runs += dead.scheduled
        kills += bool(dead.held)
        deadline = time.time() + 300
        while time.time() < deadline:
            connection.close()
            try:
                left = Workflow.objects.filter(status__in=["scheduled", "running", "waiting"]).count()
            except Exception:  # the database may still be coming back
                left = -1
            if left == 0:
                break
            time.sleep(1)
    finally:
        fleet.stop_all()
    connection.close()
    elapsed = time.time() - started

    statuses = Counter(Workflow.objects.values_list("status", flat=True))
    with connection.cursor() as cursor:
        cursor.execute("SELECT run_id, step_id, unsafe, pid, started, ended FROM chaos_effect")
        effects = cursor.fetchall()
        cursor.execute("SELECT run_id, value FROM chaos_effect WHERE value IS NOT NULL")
        served_values = cursor.fetchall()
    per_step = Counter((run_id, step_id) for run_id, step_id, *_ in effects)
    unsafe_steps = {(run_id, step_id) for run_id, step_id, unsafe, *_ in effects if unsafe}
    # Waits and start_child calls are recorded as steps but have no effect of their own.
    no_effect = [*WAIT_STEP_NAMES, qualified_name(chaos_workflows.child)]
    recorded = list(Step.objects.exclude(name__in=no_effect).values_list("workflow_id", "step_id", "status"))
    requeues = sum(_requeues_logged(path.read_text()) for path in logdir.glob("chaos-*.log"))
    reconnects = _reconnects_logged(logdir)

    if statuses["failed"]:
        # No kind of run fails on purpose (the "cleanup" kind catches its failing step).
        errors = Counter(f"{e.get('type')}: {e.get('message')}" for e in
                         Workflow.objects.filter(status="failed").values_list("error", flat=True))
        violations.append(f"{statuses['failed']} runs failed, e.g. {errors.most_common(1)[0][0]}")
    stuck = statuses["scheduled"] + statuses["running"] + statuses["waiting"]
    if stuck:
        violations.append(f"{stuck} runs are not terminal")
    runs += waits.children_expected()  # the parents' children are runs too
    violations += waits.check(served_values)
    if statuses.total() != runs:
        violations.append(f"{runs - statuses.total()} runs are missing")
    keys = [(run_id, step_id) for run_id, step_id, _ in recorded]
    if len(keys) != len(set(keys)):
        violations.append("a step was recorded twice")
    unrecorded_effects = [k for k, status in zip(keys, (s for *_, s in recorded), strict=True)
                          if status == "done" and per_step[k] == 0]
    if unrecorded_effects:
        violations.append(f"{len(unrecorded_effects)} steps recorded done without their effect")
    duplicate_unsafe = [k for k in unsafe_steps if per_step[k] > 1]
    if duplicate_unsafe:
        violations.append(f"{len(duplicate_unsafe)} unsafe-to-repeat effects ran twice")
    safe_duplicates = sum(n - 1 for k, n in per_step.items() if n > 1 and k not in unsafe_steps)
    crash_bound = (kills + terms + (pg_restarts + bouncer_restarts) * workers) * args.pool * 2
    if safe_duplicates > crash_bound:
        violations.append(f"{safe_duplicates} repeated safe effects for {kills} kills "
                          f"(bound {crash_bound})")
    if bouncer is not None:
        # A client that prepares a statement PgBouncer already keeps for it is
        # cut off: its runs are requeued and nothing else shows it.
        cut_off = [line for line in bouncer.log().splitlines() if "pooler error: prepared statement" in line]
        if cut_off:
            violations.append(
                f"PgBouncer cut {len(cut_off)} client(s) off over prepared statements: {cut_off[0]}"
            )
    overlaps = _overlapping_runs(effects, fleet.kill_times)
    if overlaps:
        violations.append(f"{len(overlaps)} runs were run by two processes at the same time")

    violations += dead.check_finished()

    print(table(
        [[runs, len(recorded), len(effects), kills, terms, pg_restarts, reconnects, requeues,
          statuses["blocked"], safe_duplicates, len(duplicate_unsafe), f"{elapsed:.0f} s"]],
        ["runs", "steps", "effects", "SIGKILL", "SIGTERM", "pg restarts", "reconnects", "requeues",
         "blocked", "repeated safe", "repeated unsafe", "time"],
    ))
    print(dead.summary())
    print(waits.summary())
    if bouncer is not None:
        print(f"PgBouncer: killed and restarted {bouncer_restarts} time(s); the workers logged "
              f"{bouncer_reconnects} reconnect(s) after it")
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
    if violations:
        print("VIOLATIONS:\n- " + "\n- ".join(violations))
        return 1
    print("no violations")
    return 0


class Waits:
    """The waiting workloads: runs that sleep between effect steps, runs that
    wait for an event the controller sends before the wait is reached, after,
    or never (the timeout path), and parents that start a child and return its
    result. Their checks: every sent event served exactly once (the first
    value, to a run that reached its wait), a duplicate send refused, the
    unsent runs timed out; exactly one child per start_child; the parent's
    result is the child's."""

    SENT_TIMEOUT = 120.0  # an event that is sent always comes first; a lost one shows as its timeout

    def __init__(self, rng: random.Random, scale: int, chaos_seconds: float):
        self.rng = rng
        self.chaos_seconds = chaos_seconds
        self.counts = {"sleepers": 3 * scale, "evented": 9 * scale, "parents": 4 * scale}
        self.sleepers: list = []
        self.parents: dict = {}  # run id -> n
        self.plan: dict = {}  # evented run id -> "early" | "late" | "never"
        self.due: list = []  # (when, run id, value, duplicate): the late sends
        self.sent: dict = {}  # run id -> the first value sent
        self.stored: dict = {}  # (run id, value) -> what send_event returned
        self.to_waiting = 0  # first sends that found the run already waiting
        self.violations: list[str] = []

    def schedule(self) -> int:
        from bench import chaos_workflows
        from everystep import schedule

        for _ in range(self.counts["sleepers"]):
            self.sleepers.append(schedule(chaos_workflows.sleeper, round(self.rng.uniform(0.2, 1.5), 2)).id)
        for n in range(self.counts["parents"]):
            self.parents[schedule(chaos_workflows.parent, n).id] = n
        start = time.time()
        for i in range(self.counts["evented"]):
            plan = ("early", "late", "never")[i % 3]
            timeout = self.SENT_TIMEOUT if plan != "never" else round(self.rng.uniform(1, 4), 2)
            run_id = schedule(chaos_workflows.evented, timeout).id
            self.plan[run_id] = plan
            value = f"{run_id}:first"
            if plan == "early":  # before any worker runs: sent before the wait is reached
                self._send(run_id, value)
            elif plan == "late":  # at a random moment of the chaos: before or after the wait
                self.due.append((start + self.rng.uniform(0, self.chaos_seconds * 0.8), run_id, value))
            if plan != "never" and i % 2:  # and a second send, later: refused, not served
                self.due.append((start + self.rng.uniform(0, self.chaos_seconds), run_id, f"{run_id}:second"))
        self.due.sort()
        return len(self.sleepers) + len(self.parents) + len(self.plan)

    def children_expected(self) -> int:
        return len(self.parents)

    def send_due(self, *, everything: bool = False) -> None:
        while self.due and (everything or self.due[0][0] <= time.time()):
            _, run_id, value = self.due.pop(0)
            self._send(run_id, value)

    def _send(self, run_id, value: str) -> None:
        from bench.chaos_workflows import EVENT_KEY
        from everystep import send_event
        from everystep.models import Workflow

        for _ in range(120):  # the controller's sends outlive the server's restart too
            try:
                _fresh_connection()
                waiting = Workflow.objects.filter(id=run_id, status="waiting").exists()
                self.stored[(run_id, value)] = send_event(run_id, EVENT_KEY, value)
                break
            except Exception:  # noqa: BLE001 - the database coming back
                time.sleep(0.25)
        else:
            self.violations.append(f"could not send the event {value}")
            return
        if run_id not in self.sent:
            self.sent[run_id] = value
            self.to_waiting += waiting

    def check(self, served_values) -> list[str]:
        from bench import chaos_workflows
        from everystep.children import KEY_PREFIX
        from everystep.models import ChildRun, Event, Workflow
        from everystep.registry import qualified_name

        served = defaultdict(set)
        for run_id, value in served_values:
            served[run_id].add(value)
        ends = dict((i, (s, r)) for i, s, r in Workflow.objects.filter(
            id__in=[*self.sleepers, *self.parents, *self.plan]).values_list("id", "status", "result"))
        self.timeouts = self.served = 0
        for (run_id, value), stored in self.stored.items():
            if stored != (self.sent[run_id] == value):
                self.violations.append(
                    f"send_event returned {stored} for {value} (first sent: {self.sent[run_id]})")
        events = Counter(Event.objects.filter(run_id__in=list(self.plan)).values_list("run_id", flat=True))
        for run_id, plan in self.plan.items():
            status, result = ends.get(run_id, (None, None))
            first = self.sent.get(run_id)
            if events[run_id] != (first is not None):
                self.violations.append(f"run {run_id} has {events[run_id]} stored events ({plan})")
            if first is None:
                if status != "completed" or result != {"timeout": True} or served[run_id]:
                    self.violations.append(f"run {run_id} was sent no event but ended {status} {result} "
                                           f"having served {sorted(served[run_id])}")
                self.timeouts += 1
            elif status != "completed" or result != {"value": first} or served[run_id] != {first}:
                self.violations.append(f"run {run_id} ({plan}) was sent {first!r} but ended {status} "
                                       f"{result} having served {sorted(served[run_id])}")
            else:
                self.served += 1
        for run_id in self.sleepers:
            if ends.get(run_id) != ("completed", "slept"):
                self.violations.append(f"sleeping run {run_id} ended {ends.get(run_id)}")
        self.children = 0
        child_name = qualified_name(chaos_workflows.child)
        for run_id, n in self.parents.items():
            kids = list(Workflow.objects.filter(idempotency_key__startswith=f"{KEY_PREFIX}{run_id}:")
                        .values_list("id", "status", "result"))
            links = ChildRun.objects.filter(parent_id=run_id).count()
            # Counted by their argument as well (every parent passes its own n): a
            # child inserted without the key, or a second one, shows here too.
            by_args = Workflow.objects.filter(name=child_name, args=[n]).count()
            self.children += by_args
            if len(kids) != 1 or links != 1 or by_args != 1:
                self.violations.append(f"parent {run_id} has {len(kids)} children under its key, "
                                       f"{by_args} with its argument and {links} links, not 1")
                continue
            expected = {"from_child": {"child": n}}
            if kids[0][1:] != ("completed", {"child": n}) or ends.get(run_id) != ("completed", expected):
                self.violations.append(f"parent {run_id} ended {ends.get(run_id)}, its child {kids[0][1:]}")
        return self.violations

    def summary(self) -> str:
        plans = Counter(self.plan.values())
        refused = sum(1 for stored in self.stored.values() if not stored)
        return (
            f"waits: {len(self.sleepers)} sleeping runs ({2 * len(self.sleepers)} sleeps); "
            f"{len(self.plan)} event runs: {len(self.sent)} events sent ({plans['early']} before the wait, "
            f"{plans['late']} at random moments, {self.to_waiting} of all to a run already waiting), "
            f"{refused} duplicate sends refused, "
            f"{getattr(self, 'served', 0)} served, {getattr(self, 'timeouts', 0)} timeouts; "
            f"{len(self.parents)} parents, {getattr(self, 'children', 0)} children"
        )


class DeadWorker:
    """A worker SIGKILLed and never restarted, and what became of the runs it held."""

    def __init__(self, name: str):
        self.name = name
        self.scheduled = 0  # runs scheduled for this case
        self.held: list = []  # the runs left running under its name
        self.killed_at = 0.0
        self.handoff: float | None = None  # seconds from the kill until none was left
        self.finished: float | None = None  # ... until the last of them ended
        self.violations: list[str] = []

    def check_finished(self) -> list[str]:
        """Every run it held ended, ended by another worker."""
        from everystep.models import Workflow

        held = Workflow.objects.filter(id__in=self.held)
        ends = list(held.values_list("status", "claimed_by", "completed_at"))
        if any(status in ("scheduled", "running") for status, _, _ in ends):
            self.violations.append(f"runs of the dead worker {self.name} did not finish")
        elif any(claimer == self.name for _, claimer, _ in ends):
            self.violations.append(f"a run of the dead worker {self.name} ended under its name")
        elif ends:
            self.finished = max(ended.timestamp() for _, _, ended in ends) - self.killed_at
        return self.violations

    def summary(self) -> str:
        if self.handoff is None:
            return f"dead worker {self.name}: " + "; ".join(self.violations)
        finished = f"{self.finished:.1f} s" if self.finished is not None else "never"
        return (
            f"dead worker {self.name}: SIGKILLed holding {len(self.held)} runs, never restarted; "
            f"none left under its name {self.handoff:.2f} s after the kill (limit: "
            f"EVERYSTEP_RECOVER_STALE_AFTER {STALE_AFTER:g} s + one poll {POLL:g} s); "
            f"the last of them ended {finished} after the kill"
        )


def kill_for_good(fleet: Fleet, pool: int, rng: random.Random) -> DeadWorker:
    """SIGKILL a worker that holds runs, never restart it, and time how long
    until none is left under its name."""

    from django.conf import settings

    from bench import chaos_workflows
    from everystep import schedule
    from everystep.models import Workflow

    _fresh_connection()
    dead = DeadWorker(rng.choice(sorted(fleet.procs)))
    # Fresh work for every worker, so that the one to die holds runs mid-step.
    dead.scheduled = len(fleet.procs) * pool * 2
    for i in range(dead.scheduled):
        schedule(chaos_workflows.mixed, chaos_workflows.KINDS[i % len(chaos_workflows.KINDS)])
    # Watched on a direct connection when there is one (--pgbouncer): the
    # controller's own query must not queue in PgBouncer and add to the time.
    watch = "listen" if "listen" in settings.DATABASES else "default"
    stranded = Workflow.objects.using(watch).filter(status="running", claimed_by=dead.name)
    deadline = time.time() + 60
    while not stranded.exists():
        if time.time() > deadline:
            dead.violations.append(f"{dead.name} held no run within 60 s; it was not killed")
            return dead
        time.sleep(RESOLUTION)
    pid = fleet.procs[dead.name].pid
    fleet.kill(dead.name, restart=False)
    dead.killed_at = fleet.kill_times[pid]
    dead.held = list(stranded.values_list("id", flat=True))  # dead: the set cannot change
    if not dead.held:
        dead.violations.append(f"{dead.name} finished its runs between the check and the kill")
        return dead
    while stranded.exists() and time.time() - dead.killed_at < STALE_AFTER + 120:
        time.sleep(RESOLUTION)
    dead.handoff = time.time() - dead.killed_at
    if dead.handoff > STALE_AFTER + POLL + RESOLUTION:
        dead.violations.append(
            f"the dead worker's runs were requeued {dead.handoff:.2f} s after the kill, later than "
            f"EVERYSTEP_RECOVER_STALE_AFTER plus one poll ({STALE_AFTER:g} + {POLL:g} s)"
        )
    return dead


def _fresh_connection() -> None:
    """Get past the connections the server's restart broke (the pool still holds some)."""
    from django.db import OperationalError, connection

    for _ in range(20):
        connection.close()
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            return
        except OperationalError:
            time.sleep(0.25)
    raise RuntimeError("the soak's database is unreachable")


def _reconnects_logged(logdir: Path) -> int:
    """Times the workers logged reconnecting to the database (RECONNECTED)."""
    logs = [path.read_text(errors="replace") for path in logdir.glob("chaos-*.log")]
    return sum(log.count(marker) for log in logs for marker in RECONNECTED)


def _requeues_logged(log: str) -> int:
    """Runs the workers said they handed back (drains, database outage)."""
    count = 0
    for line in log.splitlines():
        if " of worker " in line:  # runs recovered from a dead worker: counted apart
            continue
        found = re.search(r"requeued (\d+) run", line)
        if found:
            count += int(found.group(1))
        elif "requeueing" in line:
            count += 1
    return count


def _overlapping_runs(effects, kill_times) -> list:
    """Runs whose effects from two different processes overlap in time."""
    spans = defaultdict(list)
    for run_id, _step, _unsafe, pid, started, ended in effects:
        spans[run_id].append((started, ended or kill_times.get(pid, started), pid))
    bad = []
    for run_id, items in spans.items():
        items.sort()
        latest_end, latest_pid = None, None
        for start, end, pid in items:
            if latest_end is not None and pid != latest_pid and start < latest_end:
                bad.append(run_id)
                break
            if latest_end is None or end > latest_end:
                latest_end, latest_pid = end, pid
    return bad


if __name__ == "__main__":
    sys.exit(main())
