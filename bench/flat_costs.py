"""Flat costs as history grows, on PostgreSQL: the same work on a small
history and on a long one, side by side, and the prune against the rate a
fleet of workers makes history.

Two databases of the run's own: the baseline, with ``--baseline-runs``
finished runs (5,000: enough for every list page to be full, so that both
render the same rows), and the full one, with ``--runs`` finished runs of
``--steps / --runs`` steps each. Both are loaded in SQL (``INSERT ... SELECT
generate_series``): runs spread over 30 days ending a day ago, time-ordered
UUIDv7 ids in created order, mostly completed, 2% failed, 0.1% stopped; then
VACUUM ANALYZE. Each round measures both databases operation by operation,
the one going first alternating, so that both share whatever else the
machine does at that moment:

- claim latency: ``claims.claim_runs(limit=1)`` on a queue of ``--claims``
  freshly scheduled runs, one claim at a time;
- step insert rate: the claimed runs (10 trivial steps each) executed by the
  runner in this thread, as a worker's pool thread executes them;
- the UI: the runs list (default, filtered by status, filtered by workflow
  name), a run page (a 10-step run executed by the bench) and the overview,
  through Django's test client (logged in, ``DEBUG`` off), ``--requests``
  each after a warm-up request.

Each figure is the median over rounds of the round medians (after one
warm-up round); the full/baseline ratio is judged against 1.20. Then
``everystep_prune`` on the full database, in two halves (the oldest
``--prune-fraction / 2`` of the history, then the next), as runs/s and step
rows/s removed, next to the insert rate of a fleet (``--workers`` worker
processes x ``--pool``, bench/throughput.py's round, on the baseline
database) or ``--fleet-steps-per-s`` if given. The disk the full database's
tables take per million steps (``pg_total_relation_size``) is measured
before the prune.

The full database takes minutes to load at the issue's size (10 million
steps, a million runs); ``--keep`` keeps it (``everystep_bench_flat_<runs>_<steps>``
next to ``EVERYSTEP_BENCH_DATABASE_URL``'s database) for the next ``--keep``
run. Without it both databases are dropped at the end. The prune deletes
the oldest part of the history; the next ``--keep`` run puts it back.

Usage: python bench/flat_costs.py [--runs 1000000 --steps 10000000] [--rounds 5] [--claims 50]
       [--requests 5] [--prune-fraction 0.1] [--fleet-runs 2000 | --fleet-steps-per-s N] [--keep]
       [--json FILE]
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    DEFAULT_DATABASE_URL,
    LOGDIR,
    as_printed,
    everystep_tables,
    kept_database,
    median,
    scratch_database,
    table,
)

DAYS = 30
LIMIT = 1.20  # full / baseline
# Registered names: the UI's workflow filter offers only those.
RUN_NAMES = ["bench.workflows.ten_steps"] * 4 + ["bench.workflows.many_steps"]

# One statement per chunk of runs: the runs (UUIDv7 ids, one distinct
# millisecond each, oldest first) and their steps, in id order as workers
# write them. The steps' foreign key checks see the CTE's rows.
LOAD_CHUNK = """
WITH source AS (
    SELECT i, md5(i::text || random()::text) AS h,
           %(start_ms)s::bigint + (i * %(spacing_ms)s)::bigint AS ms,
           CASE WHEN i %% 50 = 0 THEN 'failed' WHEN i %% 1000 = 1 THEN 'stopped'
                ELSE 'completed' END AS status
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i
), runs AS (
    INSERT INTO everystep_workflow
        (id, name, args, idempotency_key, status, claimed_by, result, error, created_at, completed_at)
    SELECT
        (lpad(to_hex(ms), 12, '0') || '7' || substr(h, 1, 3) || substr('89ab', 1 + (i %% 4)::int, 1)
            || substr(h, 4, 15))::uuid,
        (%(names)s::text[])[1 + (i %% %(name_count)s)::int],
        jsonb_build_array(jsonb_build_object('order_id', i)),
        CASE WHEN i %% 10 = 0 THEN 'key-' || i END,
        status,
        'worker-' || (i %% 4),
        CASE WHEN status = 'completed' THEN jsonb_build_object('ok', true, 'order_id', i) END,
        CASE WHEN status = 'failed' THEN jsonb_build_object(
                'type', 'builtins.ValueError', 'message', 'card declined for order ' || i,
                'args', '[]'::jsonb)
             WHEN status = 'stopped' THEN jsonb_build_object(
                'type', 'everystep.errors.Terminal', 'message', 'out of stock', 'args', '[]'::jsonb)
        END,
        to_timestamp(ms / 1000.0),
        to_timestamp(ms / 1000.0) + (50 + i %% 2000) * interval '1 millisecond'
    FROM source
    RETURNING id, status
)
INSERT INTO everystep_step (workflow_id, step_id, name, args, kwargs, status, result, error)
SELECT r.id, s::text, 'bench.workflows.noop', jsonb_build_array(s - 1), '{}'::jsonb,
       CASE WHEN s = %(per_run)s AND r.status = 'failed' THEN 'failed' ELSE 'done' END,
       CASE WHEN s = %(per_run)s AND r.status = 'failed' THEN NULL ELSE to_jsonb(s - 1) END,
       CASE WHEN s = %(per_run)s AND r.status = 'failed' THEN jsonb_build_object(
           'type', 'builtins.ValueError', 'message', 'card declined', 'args', '[]'::jsonb) END
FROM runs AS r CROSS JOIN generate_series(1, %(per_run)s) AS s
ORDER BY r.id, s
"""
CHUNK_RUNS = 100_000


# ---------------------------------------------------------------- databases


def make_databases(runs: int, steps: int, keep: bool) -> None:
    """Create both databases, load Django on them (``default`` is the baseline,
    ``full`` the other) and migrate both."""
    url = os.environ.get("EVERYSTEP_BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    os.environ["EVERYSTEP_BENCH_DATABASE_URL"] = scratch_database(url, "flat_base")
    os.environ["EVERYSTEP_BENCH_FULL_DATABASE_URL"] = (
        kept_database(url, f"flat_{runs}_{steps}") if keep else scratch_database(url, "flat_full")
    )
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.flat_costs_settings"
    import django

    django.setup()
    from django.core.management import call_command

    for alias in ("default", "full"):
        call_command("migrate", database=alias, verbosity=0)


def load(alias: str, runs: int, steps: int) -> None:
    """Fill ``alias``'s database up to ``runs`` synthetic runs (``steps`` steps in all)."""
    from django.db import connections

    per_run = steps // runs
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS bench_flat_load (runs bigint, steps bigint, start_ms bigint)"
        )
        cursor.execute("SELECT runs, steps, start_ms FROM bench_flat_load")
        loaded = cursor.fetchone()
        if loaded is None or loaded[:2] != (runs, steps):
            cursor.execute(f"TRUNCATE bench_flat_load, {everystep_tables()}")
            # Ending a day ago: the overview's last hour and the queue are the bench's own.
            start_ms = int(time.time() * 1000) - (DAYS + 1) * 86_400_000
            cursor.execute("INSERT INTO bench_flat_load VALUES (%s, %s, %s)", [runs, steps, start_ms])
            missing = runs
        else:
            # A kept database the prune thinned out: its oldest runs (the
            # first ``missing`` of the series) go back in.
            start_ms = loaded[2]
            cursor.execute("SELECT count(*) FROM everystep_workflow WHERE claimed_by LIKE 'worker-%%'")
            missing = runs - cursor.fetchone()[0]
            if missing <= 0:
                print(f"flat_costs: reusing the {runs} runs loaded into {alias}")
                return
        cursor.execute("SET synchronous_commit = off")
        print(f"flat_costs: loading {missing} runs x {per_run} steps into {alias}...", flush=True)
        started = time.perf_counter()
        spacing = DAYS * 86_400_000 / runs
        for first in range(1, missing + 1, CHUNK_RUNS):
            last = min(missing, first + CHUNK_RUNS - 1)
            cursor.execute(LOAD_CHUNK, {
                "start_ms": start_ms, "spacing_ms": spacing, "first": first, "last": last,
                "names": RUN_NAMES, "name_count": len(RUN_NAMES), "per_run": per_run,
            })
            print(f"  {last} runs, {time.perf_counter() - started:.0f} s", flush=True)
        cursor.execute("RESET synchronous_commit")  # the bench's own commits are measured
        # VACUUM marks a page all-visible only once the commits of its rows are on
        # disk; the load's were not waited for. This commit waits for all of them,
        # so that the counts read the index alone, as on a history autovacuum has seen.
        cursor.execute("UPDATE bench_flat_load SET runs = runs")
        cursor.execute("VACUUM ANALYZE everystep_workflow")
        cursor.execute("VACUUM ANALYZE everystep_step")
        print(f"flat_costs: loaded in {time.perf_counter() - started:.0f} s", flush=True)


# ---------------------------------------------------------------- one round

ALIASES = {"baseline": "default", "full": "full"}


def on(alias: str):
    """Everystep's queries (engine and UI) go to ``alias`` inside this block."""
    from django.test import override_settings

    return override_settings(EVERYSTEP_DATABASE=alias)


def pairs(count: int):
    """``count`` times both databases, the one going first alternating: the two
    share whatever else the machine is doing at that moment."""
    names = list(ALIASES)
    for i in range(count):
        for name in names if i % 2 == 0 else names[::-1]:
            yield i, name


def claims_and_steps(claims: int) -> tuple[dict, dict, dict]:
    """Per database: claim latencies (ms), the runner's steps/s over the
    claimed runs, and the id of one of them (for the run page)."""
    from bench.workflows import ten_steps
    from everystep import claims as claiming
    from everystep import database, runner, schedule

    for alias in ALIASES.values():
        with on(alias), database.atomic():
            for _ in range(claims):
                schedule(ten_steps)
    latencies = {name: [] for name in ALIASES}
    claimed = {name: [] for name in ALIASES}
    for _, name in pairs(claims):
        with on(ALIASES[name]):
            start = time.perf_counter()
            runs = claiming.claim_runs("bench-flat", 1)
            latencies[name].append((time.perf_counter() - start) * 1000)
            claimed[name] += runs
    seconds = {name: 0.0 for name in ALIASES}
    for i, name in pairs(claims):
        run = claimed[name][i]
        with on(ALIASES[name]):
            start = time.perf_counter()
            status = runner.execute(run, "bench-flat")
            seconds[name] += time.perf_counter() - start
        if status != "completed":
            raise RuntimeError(f"run {run.id} ended {status}")
    steps_per_s = {name: 10 * claims / seconds[name] for name in ALIASES}
    return latencies, steps_per_s, {name: str(runs[-1].id) for name, runs in claimed.items()}


def pages(run_id: str) -> list[tuple[str, str]]:
    from urllib.parse import urlencode

    from django.urls import reverse

    changelist = reverse("admin:everystep_workflow_changelist")
    return [
        ("runs list", changelist),
        ("runs list, status = failed", f"{changelist}?{urlencode({'status': 'failed'})}"),
        ("runs list, workflow = ten_steps",
         f"{changelist}?{urlencode({'name': 'bench.workflows.ten_steps'})}"),
        ("run page, 10 steps", reverse("admin:everystep_workflow_run", args=[run_id])),
        ("overview", reverse("admin:everystep_workflow_overview")),
    ]


def page_times(client, run_ids: dict, requests: int) -> dict[str, dict[str, float]]:
    """Per database, each page's median time (ms) over ``requests`` requests
    after a warm-up one."""
    urls = {name: pages(run_ids[name]) for name in ALIASES}
    times = {name: {} for name in ALIASES}
    for page in range(len(urls["full"])):
        samples = {name: [] for name in ALIASES}
        for i, name in pairs(requests + 1):
            label, url = urls[name][page]
            with on(ALIASES[name]):
                start = time.perf_counter()
                response = client.get(url)
                elapsed = (time.perf_counter() - start) * 1000
            if response.status_code != 200:
                raise RuntimeError(f"GET {url} answered {response.status_code}")
            if i:  # the first of each is a warm-up
                samples[name].append(elapsed)
        for name in ALIASES:
            times[name][label] = median(samples[name])
    return times


def one_round(client, args, run_page: dict) -> dict[str, dict[str, float]]:
    """Both databases side by side, operation by operation; each one's figures."""
    latencies, steps_per_s, run_ids = claims_and_steps(args.claims)
    for name, run_id in run_ids.items():
        run_page.setdefault(name, run_id)  # the same run every round
    times = page_times(client, run_page, args.requests)
    figures = {}
    for name in ALIASES:
        figures[name] = {"claim latency, ms": median(latencies[name]),
                         "steps/s, one thread": steps_per_s[name]}
        figures[name].update({f"{label}, ms": ms for label, ms in times[name].items()})
    return figures


def claim_buffers(alias: str) -> int:
    """Buffers the claim's read touches (``EXPLAIN (ANALYZE, BUFFERS)`` of its
    subquery, with one run waiting): what the claim reads, load aside."""
    import re

    from django.db import connections

    from bench.workflows import ten_steps
    from everystep import claims, runner, schedule

    with on(alias):
        schedule(ten_steps)
        select = claims.POSTGRESQL[claims.POSTGRESQL.index("SELECT"):claims.POSTGRESQL.index(") RETURNING")]
        with connections[alias].cursor() as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {select}", [[], 1])
            plan = "\n".join(row[0] for row in cursor.fetchall())
        for run in claims.claim_runs("bench-flat", 1):  # leave no run waiting
            runner.execute(run, "bench-flat")
    found = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", plan)
    return int(found[1]) + int(found[2] or 0) if found else -1


# ---------------------------------------------------------------- the prune


def prune_rates(runs: int, steps: int, fraction: float) -> list[dict]:
    """Prune the oldest ``fraction`` of the full database's history in two
    halves; runs/s and step rows/s of each."""
    from django.core.management import call_command
    from django.db import connections

    from everystep.models import Workflow

    per_run = steps // runs
    halves = []
    with on("full"):
        # The synthetic history ends a day ago and spans DAYS days.
        for cut in (fraction / 2, fraction):
            older_than_days = 1 + DAYS * (1 - cut)
            before = Workflow.objects.count()
            start = time.perf_counter()
            call_command("everystep_prune", older_than=older_than_days, stdout=open(os.devnull, "w"))  # noqa: SIM115
            seconds = time.perf_counter() - start
            deleted = before - Workflow.objects.count()
            halves.append({"runs": deleted, "seconds": seconds, "runs_per_s": deleted / seconds,
                           "steps_per_s": deleted * per_run / seconds})
        with connections["full"].cursor() as cursor:
            cursor.execute("ANALYZE everystep_workflow")
    return halves


def fleet_rate(args) -> dict:
    if args.fleet_steps_per_s:
        return {"steps_per_s": args.fleet_steps_per_s, "runs_per_s": args.fleet_steps_per_s / 10,
                "source": "--fleet-steps-per-s"}
    from bench.throughput import everystep_round

    figures = everystep_round(args.fleet_runs, args.workers, args.pool, 0.2, LOGDIR)
    source = f"measured: {args.fleet_runs} runs, {args.workers} workers x pool {args.pool}"
    return {**figures, "source": source}


def disk(steps: int) -> dict:
    from django.db import connections

    with connections["full"].cursor() as cursor:
        cursor.execute(
            "SELECT pg_total_relation_size('everystep_workflow'), pg_total_relation_size('everystep_step'), "
            "(SELECT count(*) FROM everystep_step)"
        )
        runs_bytes, steps_bytes, rows = cursor.fetchone()
    return {"workflow_bytes": runs_bytes, "step_bytes": steps_bytes, "step_rows": rows,
            "mb_per_million_steps": (runs_bytes + steps_bytes) / 1e6 / (rows / 1e6)}


# ---------------------------------------------------------------- main


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=100_000, help="finished runs in the full database")
    parser.add_argument("--steps", type=int, default=1_000_000, help="step rows in the full database")
    parser.add_argument("--baseline-runs", type=int, default=5000,
                        help="finished runs in the baseline database: enough for full list pages")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, alternating the two databases")
    parser.add_argument("--claims", type=int, default=50, help="runs claimed and executed per round")
    parser.add_argument("--requests", type=int, default=5, help="timed requests per page per round")
    parser.add_argument("--prune-fraction", type=float, default=0.1,
                        help="share of the full database's history the prune removes")
    parser.add_argument("--fleet-runs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pool", type=int, default=8)
    parser.add_argument("--fleet-steps-per-s", type=float, help="the fleet's rate, instead of measuring it")
    parser.add_argument("--keep", action="store_true", help="keep the full database, and reuse it")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.steps < args.runs:
        parser.error("--runs must be at least 1 and --steps at least --runs")
    if not 1 <= args.baseline_runs <= args.runs:
        parser.error("--baseline-runs must be between 1 and --runs")
    if not 0 < args.prune_fraction <= 1:
        parser.error("--prune-fraction must be in (0, 1]")
    if args.rounds < 1 or args.claims < 1 or args.requests < 1:
        parser.error("--rounds, --claims and --requests must be at least 1")
    if args.fleet_runs < 1 or args.workers < 1 or args.pool < 1:
        parser.error("--fleet-runs, --workers and --pool must be at least 1")

    make_databases(args.runs, args.steps, args.keep)
    load("default", args.baseline_runs, args.baseline_runs * (args.steps // args.runs))
    load("full", args.runs, args.steps)
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client

    settings.DEBUG = False
    user = get_user_model().objects.create(username="bench-admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)

    rounds = {name: [] for name in ALIASES}
    run_page = {}
    one_round(client, args, run_page)  # warm-up: connections, prepared statements, templates
    for _ in range(args.rounds):
        for name, figures in one_round(client, args, run_page).items():
            rounds[name].append(figures)
    figures, rows = {}, []
    for label in rounds["baseline"][0]:
        base = median([r[label] for r in rounds["baseline"]])
        full = median([r[label] for r in rounds["full"]])
        # For a rate, "flat" is full/baseline above 1/1.20; for a time, below 1.20.
        rate = label.startswith("steps/s")
        ratio = full / base
        shown = as_printed(ratio, ".2f")  # judged as the table prints it
        ok = shown >= 1 / LIMIT if rate else shown <= LIMIT
        figures[label] = {"baseline": base, "full": full, "ratio": ratio, "pass": ok}
        rows.append([label, f"{base:.2f}", f"{full:.2f}", f"{ratio:.2f}", "PASS" if ok else "MISS"])
    print(f"\nFlat costs: a baseline of {args.baseline_runs} finished runs vs {args.runs} finished runs "
          f"and {args.steps} step rows; "
          f"median of {args.rounds} alternating rounds ({args.claims} claims and runs, "
          f"{args.requests} requests per page per round); target full/baseline within {LIMIT:.2f}")
    print(table(rows, ["figure", "baseline", "full", "full/baseline", "verdict"]))

    figures["disk"] = disk(args.steps)  # before the prune leaves dead rows behind
    buffers = {name: claim_buffers(alias) for name, alias in ALIASES.items()}
    figures["claim buffers"] = buffers
    print(f"claim's read (EXPLAIN ANALYZE, BUFFERS): baseline {buffers['baseline']} buffers, "
          f"full {buffers['full']} buffers")
    fleet = fleet_rate(args)
    halves = prune_rates(args.runs, args.steps, args.prune_fraction)
    prune_runs = sum(h["runs"] for h in halves) / sum(h["seconds"] for h in halves)
    prune_steps = prune_runs * (args.steps // args.runs)
    ok = prune_runs > fleet["runs_per_s"] and prune_steps > fleet["steps_per_s"]
    figures["prune"] = {"halves": halves, "runs_per_s": prune_runs, "steps_per_s": prune_steps,
                        "fleet": fleet, "pass": ok}
    print(f"\nPrune vs fleet ({fleet['source']}):")
    prune_rows = [[f"prune, half {n + 1}", h["runs"], f"{h['seconds']:.1f}", f"{h['runs_per_s']:.0f}",
                   f"{h['steps_per_s']:.0f}"] for n, h in enumerate(halves)]
    pruned, seconds = sum(h["runs"] for h in halves), sum(h["seconds"] for h in halves)
    prune_rows.append(["prune, all", pruned, f"{seconds:.1f}", f"{prune_runs:.0f}", f"{prune_steps:.0f}"])
    prune_rows.append(["fleet inserts", fleet.get("runs", "-"), f"{fleet.get('seconds', 0):.1f}",
                       f"{fleet['runs_per_s']:.0f}", f"{fleet['steps_per_s']:.0f}"])
    print(table(prune_rows, ["", "runs", "seconds", "runs/s", "steps/s"]))
    print(f"prune / fleet: {prune_runs / fleet['runs_per_s']:.2f} x  {'PASS' if ok else 'MISS'}")

    d = figures["disk"]
    print(f"\nDisk (full database, before the prune): everystep_workflow {d['workflow_bytes'] / 1e6:.0f} MB, "
          f"everystep_step {d['step_bytes'] / 1e6:.0f} MB for {d['step_rows']} step rows: "
          f"{d['mb_per_million_steps']:.0f} MB per million steps (tables, indexes, TOAST)")
    if args.json:
        Path(args.json).write_text(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
