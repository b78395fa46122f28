"""Throughput on PostgreSQL: N runs of a 10-step trivial workflow
(``bench.workflows.ten_steps``), all scheduled up front, drained by worker
processes started as an operator starts them (``everystep_worker``).

The clock runs from the first claim (the first run seen leaving ``scheduled``,
polled every few milliseconds) to the last ``completed_at``, so worker start-up
and the scheduling itself are not counted. Side by side, the same workload on
DBOS Transact (``bench/dbos_peer.py``, in its own virtualenv) on the same
PostgreSQL server, with the same parallelism.

Each engine runs ``--rounds`` times, the two alternating, and the medians are
compared (one round of either swings by a quarter on this kind of machine).

Usage: python bench/throughput.py [--runs 2000] [--workers 2] [--pool 8] [--rounds 3] [--no-dbos]
       [--json FILE]
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.common import LOGDIR, setup, table  # noqa: E402
from bench.fleet import STEPS_PER_RUN, fleet_round  # noqa: E402

DBOS_VENV = ROOT / "bench" / ".venv-dbos"
DBOS_REQUIREMENT = "dbos"


def everystep_round(runs: int, workers: int, pool: int, poll: float, logdir: Path) -> dict:
    """``runs`` runs drained by ``workers`` processes of ``pool`` threads, started on the full queue."""
    names = [f"bench-tp-{i}" for i in range(workers)]
    round_ = fleet_round(runs, names, pool=pool, poll=poll, logdir=logdir)
    seconds, losses = round_["seconds"], round_["connection_losses"]
    if losses:
        print(f"warning: the database connection was lost {losses} time(s) during the round")
    return {"runs": runs, "seconds": seconds, "runs_per_s": runs / seconds,
            "steps_per_s": runs * STEPS_PER_RUN / seconds, "connection_losses": losses}


def dbos_python() -> tuple[Path | None, str]:
    """The DBOS virtualenv's interpreter, made on first use; or None and why not."""
    python = DBOS_VENV / "bin" / "python"
    if not python.exists():
        made = subprocess.run([sys.executable, "-m", "venv", str(DBOS_VENV)], capture_output=True, text=True)
        if made.returncode:
            return None, f"cannot make {DBOS_VENV}: {made.stderr.strip()}"
        (DBOS_VENV / ".gitignore").write_text("*\n")  # a scratch environment, never committed
    check = subprocess.run([str(python), "-c", "import dbos"], capture_output=True, text=True)
    if check.returncode:
        installed = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", DBOS_REQUIREMENT], capture_output=True, text=True
        )
        if installed.returncode:
            return None, f"pip install {DBOS_REQUIREMENT} failed: {installed.stderr.strip()[-2000:]}"
    return python, ""


def dbos_round(runs: int, processes: int, concurrency: int, poll: float) -> dict:
    """The same workload on DBOS Transact, or ``{"error": why}``."""
    python, why = dbos_python()
    if python is None:
        return {"error": why}
    url = os.environ.get("DBOS_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/dbos_bench")
    done = subprocess.run(
        [str(python), str(ROOT / "bench" / "dbos_peer.py"), "--runs", str(runs), "--processes",
         str(processes), "--concurrency", str(concurrency), "--poll", str(poll), "--url", url, "--json", "-"],
        capture_output=True, text=True, timeout=900,
    )
    if done.returncode:
        return {"error": f"bench/dbos_peer.py exited {done.returncode}: {done.stderr.strip()[-2000:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def median_round(rounds: list[dict]) -> dict:
    """The round with the median steps/s (of an even count, the lower of the two
    middle ones), with every round's steps/s."""
    ordered = sorted(rounds, key=lambda r: r["steps_per_s"])
    return {**ordered[(len(ordered) - 1) // 2], "rounds_steps_per_s": [r["steps_per_s"] for r in rounds]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pool", type=int, default=8)
    parser.add_argument("--poll", type=float, default=0.2, help="everystep worker --poll")
    parser.add_argument("--dbos-poll", type=float, default=0.05,
                        help="DBOS queue polling_interval_sec (its default, 1 s, would starve the pool)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each engine, alternating")
    parser.add_argument("--no-dbos", action="store_true")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.runs < 1 or args.workers < 1 or args.pool < 1:
        parser.error("--rounds, --runs, --workers and --pool must be at least 1")
    setup("throughput")
    our_rounds, peer_rounds = [], []
    peer = {"error": "skipped (--no-dbos)"} if args.no_dbos else {}
    for _ in range(args.rounds):
        our_rounds.append(everystep_round(args.runs, args.workers, args.pool, args.poll, LOGDIR))
        if "error" not in peer:  # DBOS stays out once it could not run
            peer = dbos_round(args.runs, args.workers, args.pool, args.dbos_poll)
            if "error" not in peer:
                peer_rounds.append(peer)
    ours = median_round(our_rounds)
    if peer_rounds and "error" not in peer:
        peer = median_round(peer_rounds)
    rows = [["everystep", f"{ours['seconds']:.2f}", f"{ours['runs_per_s']:.0f}",
             f"{ours['steps_per_s']:.0f}"]]
    if "error" in peer:
        rows.append(["DBOS Transact", "-", "-", "-"])
    else:
        rows.append(["DBOS Transact " + peer.get("version", ""), f"{peer['seconds']:.2f}",
                     f"{peer['runs_per_s']:.0f}", f"{peer['steps_per_s']:.0f}"])
    print(f"\nThroughput: {args.runs} runs x {STEPS_PER_RUN} trivial steps, {args.workers} processes x "
          f"{args.pool} concurrent runs, first claim to last completion; median of {args.rounds} "
          "alternating rounds")
    print("rounds, steps/s: everystep " + ", ".join(f"{r['steps_per_s']:.0f}" for r in our_rounds)
          + ("; DBOS " + ", ".join(f"{r['steps_per_s']:.0f}" for r in peer_rounds) if peer_rounds else ""))
    print(table(rows, ["engine", "seconds", "runs/s", "steps/s"]))
    if "error" in peer:
        print(f"DBOS Transact not measured: {peer['error']}")
    else:
        print(f"everystep / DBOS steps/s: {ours['steps_per_s'] / peer['steps_per_s']:.2f}")
    figures = {"everystep": ours, "dbos": peer}
    if args.json:
        Path(args.json).write_text(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
