"""everystep next to its ceiling: pgbench inserting step-shaped rows.

The ceiling is what the PostgreSQL server under the benchmark commits when
nothing but a step's write goes to it: a ``pgbench`` script of one
transaction per row, each the statement a worker sends to record a step
(``INSERT INTO everystep_step ... SELECT ... FROM everystep_workflow WHERE
id = ... AND status = 'running' AND claimed_by = ...``, prepared), into the
migrated ``everystep_step`` of this run's own scratch database, so with the
same indexes (the unique ``(workflow_id, step_id)``) and the same foreign key.

In each round, alternating in the same sitting: pgbench at 1 client, everystep
at 1 process x pool 1, pgbench at the fleet's connection count, then every
``--curve`` configuration (processes x pool) of everystep. Each everystep
configuration drains ``--runs`` runs of 10 trivial steps
(``bench.workflows.ten_steps``), timed from the first claim to the last
``completed_at``. The workers are started and idle before the runs are
scheduled, so their CPU time (user + system, from /proc) over the drain is
the cost of the runs alone: it is reported per recorded step, next to
pgbench's own CPU time per transaction (its process's, as its parent reaps
it): what a client written in C spends on the same commit on the same cores,
the floor under the worker's figure on this machine. When the
PostgreSQL server runs on this machine, its CPU time (every process of it) is
read the same way, per recorded step and per pgbench transaction, so that the
table shows what a step costs the server next to what the ceiling's
transaction does; everystep's figure covers all the server did for the runs,
their scheduling included. Read it on a server nothing else uses meanwhile.

With ``--server-core CPU`` the sitting runs against a PostgreSQL server of
its own (tests/throwaway_postgres.py: a fresh cluster with default settings,
on a free port, removed at the end) whose processes are pinned to that CPU,
while this script, its workers and pgbench's client run on the others: the
layout of a deployment with the database on a host of its own, where the
server's CPU is nobody else's. On a small machine this is where the shares
can be read: on shared cores, the workers' Python and the server take turns
on the same CPUs, and each step's commit waits for both.

Figures are medians over ``--rounds`` rounds. Usage:
    python bench/ceiling.py [--runs 1000] [--rounds 3] [--seconds 5]
        [--curve 1x1,1x8,2x8,4x4] [--fleet 2x8] [--server-core CPU] [--json FILE]
"""

import argparse
import atexit
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    from bench.common import median, setup, table
    from bench.fleet import STEPS_PER_RUN, fleet_round, reset
except ImportError:  # run as a script
    from common import median, setup, table
    from fleet import STEPS_PER_RUN, fleet_round, reset

PGBENCH_CLAIMER = "pgbench"
# One running run per pgbench client (pgbench numbers them from 0), its id
# worked out from the client's number so that the script needs no lookup. Its
# fence is filled in with the worker's own (everystep.statements.RUNNING_UNDER).
PGBENCH_SCRIPT = """\
INSERT INTO everystep_step (workflow_id, step_id, name, args, kwargs, status, result, error)
SELECT id, nextval('ceiling_step_seq')::text, 'bench.workflows.noop', '[1]', '{{}}', 'done', '1', NULL
FROM everystep_workflow
WHERE id = ('00000000-0000-0000-0000-' || lpad(:client_id::text, 12, '0'))::uuid
AND {fence};
"""
# Targets (bench/run.py prints them with PASS/MISS).
SOLO_SHARE = 0.75  # 1 x 1, 10-step runs, of pgbench at 1 client
FLEET_SHARE = 0.60  # the fleet, of pgbench at the fleet's connection count
CPU_PER_STEP_US = 100


def parse_config(text: str) -> tuple[int, int]:
    try:
        processes, pool = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not PROCESSESxPOOL, e.g. 2x8") from None
    if processes < 1 or pool < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: processes and pool must be at least 1")
    return processes, pool


def label(config: tuple[int, int]) -> str:
    return f"{config[0]}x{config[1]}"


# ---------------------------------------------------------------- pgbench


def pgbench_round(clients: int, seconds: float, script: Path, server: "Server") -> dict:
    """Transactions per second of the step-shaped insert at ``clients`` clients,
    pgbench's own CPU time per transaction, and the server's (None when it is
    not on this machine)."""
    from django.conf import settings
    from django.db import connection

    reset()
    with connection.cursor() as cursor:
        cursor.execute("CREATE SEQUENCE IF NOT EXISTS ceiling_step_seq")
        cursor.execute(
            "INSERT INTO everystep_workflow (id, name, args, status, claimed_by, created_at) "
            "SELECT ('00000000-0000-0000-0000-' || lpad(n::text, 12, '0'))::uuid, 'bench.pgbench', "
            "'[]', 'running', %s, now() FROM generate_series(0, %s) AS n",
            [PGBENCH_CLAIMER, clients - 1],
        )
    connection.close()
    db = settings.DATABASES["default"]
    server_before, client_before = server.cpu_seconds(), children_cpu_seconds()
    done = subprocess.run(
        [_pgbench(), "-n", "-M", "prepared", "-c", str(clients),
         "-j", str(min(clients, os.cpu_count() or 1)), "-T", str(max(1, round(seconds))), "-f", str(script),
         "-h", db["HOST"], "-p", str(db["PORT"] or 5432), "-U", db["USER"], db["NAME"]],
        capture_output=True, text=True,
        env={**os.environ, "PGPASSWORD": db["PASSWORD"]} if db.get("PASSWORD") else None,  # Django's password
    )
    client_after = children_cpu_seconds()  # pgbench's, reaped by run(): no other child ends meanwhile
    # pgbench's backends end after pgbench does: their time is the round's.
    with connection.cursor() as cursor:
        for _ in range(500):
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgbench'")
            if cursor.fetchone()[0] == 0:
                break
            time.sleep(0.01)
    connection.close()
    server_after = server.cpu_seconds()
    found = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", done.stdout)
    processed = re.search(r"number of transactions actually processed: ([0-9]+)", done.stdout)
    if done.returncode or not found or not processed:
        raise RuntimeError(f"pgbench failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    transactions = int(processed.group(1))
    return {"tps": float(found.group(1)),
            "client_cpu_us": _per(client_before, client_after, transactions),
            "server_cpu_us": _per(server_before, server_after, transactions)}


def of_it_scheduling(scheduling: float | None) -> str:
    """The part of the server's CPU per step that scheduling took, after that figure."""
    return "" if scheduling is None else f" ({scheduling:.0f} scheduling)"


def _us(value: float | None, scheduling: float | None = None) -> str:
    return "" if value is None else f"{value:.0f} us{of_it_scheduling(scheduling)}"


def _per(before: float | None, after: float | None, count: int) -> float | None:
    """CPU µs per unit between two samples (None when the server is not on this machine)."""
    return None if before is None or after is None else (after - before) / count * 1e6


def _pgbench() -> str:
    found = shutil.which("pgbench")
    if found is None:
        raise SystemExit("pgbench is not installed: apt-get install postgresql-client "
                         "(or postgresql-contrib)")
    return found


# ---------------------------------------------------------------- everystep


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """User + system CPU time of this process's children that have ended and been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command's name (the 3rd field is fields[0])."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


class Server:
    """The CPU time of the PostgreSQL server under the benchmark, when it runs
    on this machine: its postmaster and every process it started (backends,
    WAL writer, checkpointer, autovacuum). A process that exited meanwhile is
    still counted, in its parent's children's time (stat's cutime and cstime).
    ``postmaster`` is None when the server is elsewhere (another host, a
    container with its own process ids): then there is nothing to read.
    ``backend``: the process id one of the server's connections reports
    (``pg_backend_pid()``)."""

    def __init__(self, backend: int):
        self.postmaster = None
        try:
            parent = int(_stat(backend)[1])
            if all(_command(pid) == "postgres" for pid in (backend, parent)):
                self.postmaster = parent
        except (OSError, ValueError):
            pass

    def cpu_seconds(self) -> float | None:
        if self.postmaster is None:
            return None
        for _ in range(500):
            # Its own time and its reaped children's, then each live child's.
            # A child the postmaster reaps during the scan would be counted
            # twice or not at all, and one that exited but is not reaped yet
            # shows no time of its own: read again until neither happened.
            own = _stat(self.postmaster)[11:15]
            children = self._children()
            if all(child[0] != "Z" for child in children) and _stat(self.postmaster)[11:15] == own:
                break
            time.sleep(0.01)
        ticks = sum(map(int, own)) + sum(int(child[11]) + int(child[12]) for child in children)
        return ticks / os.sysconf("SC_CLK_TCK")

    def _children(self) -> list[list[str]]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = _stat(int(entry.name))
                except OSError:
                    continue  # gone meanwhile
                if int(fields[1]) == self.postmaster:
                    found.append(fields)
        return found


def _command(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def everystep_round(
    runs: int, config: tuple[int, int], poll: float, server: Server | None = None, *,
    prefix: str = "bench-ceiling",
) -> dict:
    """Drain ``runs`` runs of 10 steps with ``processes`` workers of ``pool`` threads
    (named ``<prefix>-<processes>x<pool>-<i>``), started and idle before the runs
    are scheduled: steps/s, the workers' CPU time per step, and the server's
    (None when it is not on this machine, or no ``server`` is given), with
    the part of it that scheduling the runs took (``schedule()`` for each run,
    in one transaction before the first claim)."""
    processes, pool = config
    names = [f"{prefix}-{label(config)}-{i}" for i in range(processes)]
    samples, scheduled = [], []  # the server's CPU: before and after the round; once scheduled

    def server_cpu() -> float | None:
        return None if server is None else server.cpu_seconds()

    def sample(procs) -> float:
        samples.append(server_cpu())
        return sum(cpu_seconds(p.pid) for p in procs)

    round_ = fleet_round(runs, names, pool=pool, poll=poll, idle_first=True, sample=sample,
                         scheduled=lambda: scheduled.append(server_cpu()))
    steps = round_["steps"]
    (before, after), (runs_scheduled,) = samples, scheduled
    return {"steps_per_s": steps / round_["seconds"], "cpu_us_per_step": round_["sampled"] / steps * 1e6,
            "server_cpu_us_per_step": _per(before, after, steps),
            "server_scheduling_us_per_step": _per(before, runs_scheduled, steps)}


# ---------------------------------------------------------------- the sitting


def server_on_its_own_core(core: int) -> None:
    """Start a throwaway PostgreSQL server pinned to CPU ``core``, and name it
    in ``EVERYSTEP_BENCH_DATABASE_URL``; this process, and every process it
    starts, go on the other CPUs it may use. The server stops at exit, after
    the scratch database is dropped (exit functions run last-in, first-out)."""
    cores = os.sched_getaffinity(0)
    if core not in cores or len(cores) < 2:
        raise SystemExit(f"--server-core {core}: this process may use CPUs {sorted(cores)}; the server "
                         "needs one of them and the benchmark at least one other")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.throwaway_postgres import ThrowawayPostgres

    server = ThrowawayPostgres()
    os.sched_setaffinity(0, {core})  # inherited by initdb, pg_ctl and the server they start
    try:
        server.start()
    finally:
        atexit.register(server.stop)
        os.sched_setaffinity(0, cores - {core})
    os.environ["EVERYSTEP_BENCH_DATABASE_URL"] = server.url("everystep_bench")
    print(f"PostgreSQL of its own on port {server.port}, on CPU {core}; the rest on CPUs "
          f"{sorted(cores - {core})}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1000, help="runs of 10 steps per everystep configuration")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5, help="length of each pgbench run")
    parser.add_argument("--curve", type=lambda s: [parse_config(c) for c in s.split(",")],
                        default=[(1, 1), (1, 8), (2, 8), (4, 4)], help="processes x pool, comma-separated")
    parser.add_argument("--fleet", type=parse_config, default=(2, 8),
                        help="the configuration compared with pgbench at its connection count")
    parser.add_argument("--poll", type=float, default=0.2, help="everystep worker --poll")
    parser.add_argument("--server-core", type=int, metavar="CPU",
                        help="run against a PostgreSQL server of its own, pinned to this CPU")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.runs < 1:
        parser.error("--rounds and --runs must be at least 1")
    _pgbench()
    if args.server_core is not None:
        server_on_its_own_core(args.server_core)
    setup("ceiling")
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        server = Server(cursor.fetchone()[0])
    connection.close()
    configs = [(1, 1), args.fleet] + [c for c in args.curve if c not in ((1, 1), args.fleet)]
    fleet_clients = args.fleet[0] * args.fleet[1]
    pg = {"1": [], str(fleet_clients): []}
    ours = {label(c): [] for c in configs}
    with tempfile.TemporaryDirectory(prefix="everystep-ceiling-") as tmp:
        script = Path(tmp) / "step.sql"
        from everystep.statements import RUNNING_UNDER

        script.write_text(PGBENCH_SCRIPT.format(fence=RUNNING_UNDER % f"'{PGBENCH_CLAIMER}'"))
        for i in range(args.rounds):
            pg["1"].append(pgbench_round(1, args.seconds, script, server))
            ours["1x1"].append(everystep_round(args.runs, (1, 1), args.poll, server))
            pg[str(fleet_clients)].append(pgbench_round(fleet_clients, args.seconds, script, server))
            for config in configs[1:]:
                ours[label(config)].append(everystep_round(args.runs, config, args.poll, server))
            print(f"round {i + 1}: pgbench "
                  + ", ".join(f"{k} client(s) {v[-1]['tps']:.0f} tx/s" for k, v in pg.items())
                  + "; everystep " + ", ".join(f"{k} {v[-1]['steps_per_s']:.0f} steps/s "
                                             f"({v[-1]['cpu_us_per_step']:.0f} us CPU/step)"
                                             for k, v in ours.items()), flush=True)
    pg_med = {k: median(r["tps"] for r in v) for k, v in pg.items()}
    client_tx = {k: median(r["client_cpu_us"] for r in v) for k, v in pg.items()}
    curve = {k: {"steps_per_s": median(r["steps_per_s"] for r in v),
                 "cpu_us_per_step": median(r["cpu_us_per_step"] for r in v)} for k, v in ours.items()}
    solo, fleet = curve["1x1"], curve[label(args.fleet)]
    figures = {
        "pgbench_tps": pg_med,
        "curve": curve,
        "solo_share": solo["steps_per_s"] / pg_med["1"],
        "fleet_share": fleet["steps_per_s"] / pg_med[str(fleet_clients)],
        "fleet": label(args.fleet),
        "fleet_clients": fleet_clients,
        "cpu_us_per_step": solo["cpu_us_per_step"],
        # What pgbench's C client spent per transaction: the worker's floor here.
        "client_cpu_us_per_tx": client_tx,
        "server_core": args.server_core,
    }
    if server.postmaster is not None:
        # Where each side ran (--server-core), as the kernel has it.
        figures["cpus"] = {"server": sorted(os.sched_getaffinity(server.postmaster)),
                           "benchmark": sorted(os.sched_getaffinity(0))}
        # The server's side of each figure: how much of the shared cores a
        # step takes there, next to a pgbench transaction.
        figures["server_cpu_us_per_tx"] = {k: median(r["server_cpu_us"] for r in v) for k, v in pg.items()}
        for k, v in ours.items():
            curve[k]["server_cpu_us_per_step"] = median(r["server_cpu_us_per_step"] for r in v)
            curve[k]["server_scheduling_us_per_step"] = median(r["server_scheduling_us_per_step"] for r in v)
    print(f"\nCeiling: pgbench step-shaped inserts vs everystep, {args.runs} runs x {STEPS_PER_RUN} steps, "
          f"median of {args.rounds} alternating rounds")
    server_tx = figures.get("server_cpu_us_per_tx", {})
    print(table([[f"pgbench, {k} client(s)", f"{v:.0f} tx/s", _us(client_tx[k]), _us(server_tx.get(k)), ""]
                 for k, v in pg_med.items()]
                + [[f"everystep {k}", f"{v['steps_per_s']:.0f} steps/s", f"{v['cpu_us_per_step']:.0f} us",
                    _us(v.get("server_cpu_us_per_step"), v.get("server_scheduling_us_per_step")), ""]
                   for k, v in curve.items()]
                + [["1x1 / pgbench 1 client", f"{figures['solo_share']:.0%}", "", "", f">= {SOLO_SHARE:.0%}"],
                   [f"{label(args.fleet)} / pgbench {fleet_clients} clients",
                    f"{figures['fleet_share']:.0%}", "", "", f">= {FLEET_SHARE:.0%}"],
                   ["worker CPU per step (1x1)", f"{figures['cpu_us_per_step']:.0f} us", "", "",
                    f"<= {CPU_PER_STEP_US} us"]],
                ["figure", "value", "client CPU / step or tx", "server CPU / step or tx", "target"]))
    if not server_tx:
        print("(the server's CPU is read only when PostgreSQL runs on this machine)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
