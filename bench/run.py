"""The whole benchmark suite on PostgreSQL, one command, one table.

Runs each benchmark in its own process and database (each prints its own
table as it goes), then prints every figure next to its target with PASS or
MISS. It asserts nothing about time: the exit status says only whether every
benchmark ran. This machine may be shared, so read medians, and run it twice
before believing a MISS.

1. step overhead: 1,000 trivial steps on one thread, as a share of raw psycopg INSERTs
2. throughput: 2,000 runs of 10 steps, 2 worker processes x pool 8, next to DBOS Transact (median of 3 rounds)
3. pickup latency: commit of schedule() to the first step, LISTEN/NOTIFY and polling only
4. replay: resuming a run with 10,000 recorded steps
5. UI at scale: the runs list and a 5,000-step run page with 1,000,000 runs loaded
6. payload pages: large arguments and results drawn in Chromium
7. ceiling: everystep next to pgbench inserting step-shaped rows (1 client and the
   fleet's connection count), the worker's CPU time per step, and the scaling
   curve over processes x pool (bench/ceiling.py)
8. ceiling, server on a CPU of its own: section 7 against a PostgreSQL server of
   its own pinned to one CPU, the benchmark and its workers on the others (the
   layout of a database on a host of its own; ceiling.py --server-core)

Usage:
    python bench/run.py            # the full suite: about 9 minutes, plus 2 the first time (1M-run load)
    python bench/run.py --quick    # a smaller variant: about 2 minutes
    python bench/run.py --only pickup,ui --no-dbos
"""

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ceiling import CPU_PER_STEP_US, FLEET_SHARE, SOLO_SHARE, of_it_scheduling  # noqa: E402
from bench.common import as_printed, table  # noqa: E402

SECTIONS = ("overhead", "throughput", "pickup", "ui", "payloads", "ceiling", "ceiling-own-cpu")
# Payload pages: a target for the time Chromium takes to draw them, and a bound
# on their size (bytes of HTML), which must not grow with the payloads.
PAYLOAD_PAGE_MS = 500
PAYLOAD_PAGE_BYTES = 64_000


def commands(quick: bool, no_dbos: bool) -> dict[str, tuple[list[str], dict]]:
    """Each section's script, arguments and extra environment."""
    ceiling = ["ceiling.py", "--runs", "300" if quick else "1000", "--rounds", "1" if quick else "3",
               "--seconds", "3" if quick else "5"]
    return {
        "overhead": (["step_overhead.py", "--steps", "1000", "--rounds", "3" if quick else "9"], {}),
        "throughput": (
            ["throughput.py", "--runs", "400" if quick else "2000", "--rounds", "1" if quick else "3",
             *(["--no-dbos"] if no_dbos else [])],
            {},
        ),
        "pickup": (["pickup.py", "--runs", "50" if quick else "200"], {}),
        # The loaded runs are kept for the next run (everystep_bench_ui_<runs>).
        "ui": (["ui_scale.py", "--runs", "100000" if quick else "1000000",
                "--requests", "10" if quick else "20", "--keep"], {}),
        "payloads": (["ui_payloads.py", "--rounds", "3" if quick else "5"], {}),
        "ceiling": (ceiling, {}),
        "ceiling-own-cpu": ([*ceiling, "--server-core", str(max(os.sched_getaffinity(0)))], {}),
    }


def default_sections(cpus: set[int]) -> list[str]:
    """The sections of a full run on ``cpus``: section 8 needs one CPU for its
    server and another for the rest, so a one-CPU machine leaves it out."""
    return [name for name in SECTIONS if name != "ceiling-own-cpu" or len(cpus) >= 2]


def run_section(name: str, argv: list[str], env: dict, outdir: Path) -> tuple[dict | None, float]:
    out = outdir / f"{name}.json"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / argv[0]), *argv[1:], "--json", str(out)],
        env={**os.environ, **env}, cwd=ROOT,
    )
    elapsed = time.monotonic() - started
    if done.returncode or not out.exists():
        print(f"!! {name} failed (exit {done.returncode})")
        return None, elapsed
    return json.loads(out.read_text()), elapsed


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("PASS" if ok else "MISS")


def summary_rows(results: dict, poll: float) -> list[list[str]]:
    rows = []
    over = results.get("overhead")
    if over:
        rate = over["steps_per_s"]
        psycopg_share, orm_share = rate["engine"] / rate["psycopg"], rate["engine"] / rate["orm"]
        rows += [
            ["1 step overhead", "everystep, 1 thread", f"{rate['engine']:.0f} steps/s", "", ""],
            ["", "raw psycopg INSERT loop", f"{rate['psycopg']:.0f} rows/s", "", ""],
            ["", "Django ORM create() loop", f"{rate['orm']:.0f} rows/s", "", ""],
            ["", "everystep / raw psycopg", f"{psycopg_share:.0%}", ">= 85%",
             verdict(as_printed(psycopg_share, ".0%") >= 0.85)],
            ["", "everystep / Django ORM", f"{orm_share:.0%}", "", ""],
        ]
    tp = results.get("throughput")
    if tp:
        ours, peer = tp["everystep"], tp["dbos"]
        rows.append(["2 throughput", "everystep, 2 x 8", f"{ours['runs_per_s']:.0f} runs/s, "
                     f"{ours['steps_per_s']:.0f} steps/s", "", ""])
        if "error" in peer:
            rows.append(["", "DBOS Transact, 2 x 8", "not measured (see above)", "", ""])
        else:
            ratio = ours["steps_per_s"] / peer["steps_per_s"]
            rows += [
                ["", f"DBOS Transact {peer['version']}, 2 x 8",
                 f"{peer['runs_per_s']:.0f} runs/s, {peer['steps_per_s']:.0f} steps/s", "", ""],
                ["", "everystep / DBOS steps/s", f"{ratio:.2f}x", ">= 5x",
                 verdict(as_printed(ratio, ".2f") >= 5)],
            ]
    pick = results.get("pickup")
    if pick:
        notify, polled = pick["notify"], pick["poll"]
        rows += [
            ["3 pickup", "LISTEN/NOTIFY p50", f"{notify['p50_ms']:.1f} ms", "<= 10 ms",
             verdict(as_printed(notify["p50_ms"], ".1f") <= 10)],
            ["", "LISTEN/NOTIFY p99", f"{notify['p99_ms']:.1f} ms", "<= 50 ms",
             verdict(as_printed(notify["p99_ms"], ".1f") <= 50)],
            ["", f"polling only ({poll} s) p50", f"{polled['p50_ms']:.1f} ms", f"<= {poll * 1000:.0f} ms",
             verdict(as_printed(polled["p50_ms"], ".1f") <= poll * 1000)],
            ["", f"polling only ({poll} s) p99", f"{polled['p99_ms']:.1f} ms", "", ""],
        ]
    if over:
        rows += [
            ["4 replay", "10,000 recorded steps, load + replay", f"{over['replay_s']:.3f} s", "<= 0.5 s",
             verdict(as_printed(over["replay_s"], ".3f") <= 0.5)],
            ["", "peak memory per recorded step", f"{over['replay_kb_per_step']:.2f} KB", "a few KB (<= 4)",
             verdict(as_printed(over["replay_kb_per_step"], ".2f") <= 4)],
        ]
    ui = results.get("ui")
    if ui:
        first = True
        for label, fig in ui.items():
            if label.startswith("_"):
                continue
            rows.append(["5 UI at scale" if first else "", f"{label}, p50", f"{fig['p50_ms']:.0f} ms",
                         "<= 150 ms", verdict(as_printed(fig["p50_ms"], ".0f") <= 150)])
            first = False
    pages = results.get("payloads")
    if pages:
        first = True
        for label, fig in pages.items():
            if label.startswith("_"):
                continue
            rows += [
                ["6 payload pages" if first else "", f"{label}, drawn (Chromium)", f"{fig['ms']:.0f} ms",
                 f"<= {PAYLOAD_PAGE_MS} ms", verdict(as_printed(fig["ms"], ".0f") <= PAYLOAD_PAGE_MS)],
                ["", f"{label}, HTML", f"{fig['bytes']:,} bytes", f"<= {PAYLOAD_PAGE_BYTES:,}",
                 verdict(fig["bytes"] <= PAYLOAD_PAGE_BYTES)],
            ]
            first = False
    rows += ceiling_rows(results.get("ceiling"), "7 ceiling")
    rows += ceiling_rows(results.get("ceiling-own-cpu"), "8 ceiling, server on its own CPU")
    return rows


def ceiling_rows(ceiling: dict | None, section: str) -> list[list[str]]:
    if not ceiling:
        return []
    pg, curve = ceiling["pgbench_tps"], ceiling["curve"]
    fleet, clients = ceiling["fleet"], ceiling["fleet_clients"]
    # The server's CPU, when the benchmark could read it (a server on this machine).
    server_tx = ceiling.get("server_cpu_us_per_tx", {})

    def server(value, scheduling=None) -> str:
        if value is None:
            return ""
        return f", server {value:.0f} us CPU{of_it_scheduling(scheduling)}"

    # pgbench's own CPU per transaction: the floor under the worker's per step.
    client_tx = ceiling.get("client_cpu_us_per_tx", {})

    def pgbench(key: str) -> str:
        client = "" if key not in client_tx else f", {client_tx[key]:.0f} us CPU/tx"
        return f"{pg[key]:.0f} tx/s{client}{server(server_tx.get(key))}"

    rows = [[section, "pgbench step insert, 1 client", pgbench("1"), "", ""],
            ["", f"pgbench step insert, {clients} clients", pgbench(str(clients)), "", ""]]
    rows += [["", f"everystep {config} (processes x pool)", f"{fig['steps_per_s']:.0f} steps/s, "
              f"{fig['cpu_us_per_step']:.0f} us CPU/step"
              + server(fig.get("server_cpu_us_per_step"), fig.get("server_scheduling_us_per_step")), "", ""]
             for config, fig in curve.items()]
    return rows + [
        ["", "everystep 1x1 / pgbench 1 client", f"{ceiling['solo_share']:.0%}", f">= {SOLO_SHARE:.0%}",
         verdict(as_printed(ceiling["solo_share"], ".0%") >= SOLO_SHARE)],
        ["", f"everystep {fleet} / pgbench {clients} clients", f"{ceiling['fleet_share']:.0%}",
         f">= {FLEET_SHARE:.0%}", verdict(as_printed(ceiling["fleet_share"], ".0%") >= FLEET_SHARE)],
        ["", "worker CPU per recorded step (1x1)", f"{ceiling['cpu_us_per_step']:.0f} us",
         f"<= {CPU_PER_STEP_US} us",
         verdict(as_printed(ceiling["cpu_us_per_step"], ".0f") <= CPU_PER_STEP_US)],
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller counts, a few minutes")
    parser.add_argument("--no-dbos", action="store_true", help="skip the DBOS Transact comparison")
    parser.add_argument(
        "--only", help=f"comma-separated sections among {', '.join(SECTIONS)} (overhead includes replay)"
    )
    args = parser.parse_args(argv)
    if args.only:
        chosen = args.only.split(",")
    else:
        chosen = default_sections(os.sched_getaffinity(0))
        if "ceiling-own-cpu" not in chosen:
            print("section 8 (ceiling-own-cpu) left out: it needs two CPUs, and this process may use one")
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    plan = commands(args.quick, args.no_dbos)
    results, times, failed = {}, {}, []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="everystep-bench-") as outdir:
        for name in chosen:
            print(f"\n=== {name} ===", flush=True)
            figures, times[name] = run_section(name, *plan[name], Path(outdir))
            if figures is None:
                failed.append(name)
            else:
                results[name] = figures
    total = time.monotonic() - started
    when = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    load = os.getloadavg()
    print(f"\n=== everystep benchmarks, {'quick' if args.quick else 'full'} run, {when}, "
          f"{total / 60:.1f} min, {os.cpu_count()} CPUs, load average {load[0]:.1f} at the end ===")
    print(table(summary_rows(results, 0.2), ["section", "figure", "value", "target", "result"]))
    print("sections took: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in times.items()))
    if failed:
        print(f"failed to run: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
