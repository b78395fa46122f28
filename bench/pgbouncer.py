"""A worker fleet straight to PostgreSQL and through PgBouncer, with the
engine's prepared statements on and off, side by side in one sitting.

The fleet (2 processes x pool 8 by default) drains runs of 10 trivial steps
(``bench.fleet``), in alternating rounds of three configurations:

- ``direct``: the workers connect to PostgreSQL, prepared statements on;
- ``pgbouncer, prepared``: through a PgBouncer of the benchmark's own
  (transaction pooling, ``--server-connections`` of them), one that keeps
  prepared statements (1.21 or later: the installed one, else what
  ``scripts/pgbouncer`` builds), the engine's on (the default);
- ``pgbouncer, unprepared``: the same PgBouncer,
  ``EVERYSTEP_PREPARED_STATEMENTS = False`` (what PgBouncer before 1.21 needs).

The workers' LISTEN goes straight to PostgreSQL in all three. Printed: the
median steps/s and worker CPU per step of each, and the ratios between them.

    python bench/pgbouncer.py [--runs 500] [--rounds 3] [--fleet 2x8] [--server-connections 8]
"""

import argparse
import json
import os
import sys
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ceiling import everystep_round, label, parse_config  # noqa: E402
from bench.common import median, setup, table  # noqa: E402
from tests.throwaway_pgbouncer import ThrowawayPgBouncer  # noqa: E402

CONFIGS = ["direct", "pgbouncer, prepared", "pgbouncer, unprepared"]


def configure(config: str, direct_url: str, bouncer: ThrowawayPgBouncer) -> None:
    """The environment the next round's workers start with (bench/settings.py reads it)."""
    if config == "direct":
        os.environ.update(EVERYSTEP_BENCH_DATABASE_URL=direct_url, EVERYSTEP_BENCH_PREPARED_STATEMENTS="1")
    else:
        os.environ.update(
            EVERYSTEP_BENCH_DATABASE_URL=bouncer.url(urlparse(direct_url).path.lstrip("/")),
            EVERYSTEP_BENCH_PREPARED_STATEMENTS="1" if config.endswith(", prepared") else "0",
        )


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=500, help="runs of 10 steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fleet", type=parse_config, default=(2, 8), help="processes x pool")
    parser.add_argument("--server-connections", type=int, default=8, help="PgBouncer's pool size")
    parser.add_argument("--poll", type=float, default=0.2, help="everystep worker --poll")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.runs < 1 or args.server_connections < 1:
        parser.error("--rounds, --runs and --server-connections must be at least 1")
    setup("pgbouncer")  # this process stays on the direct connection
    direct_url = os.environ["EVERYSTEP_BENCH_DATABASE_URL"]
    target = urlparse(direct_url)
    os.environ["EVERYSTEP_BENCH_LISTEN_DATABASE_URL"] = direct_url
    figures = {config: [] for config in CONFIGS}
    with ThrowawayPgBouncer(target.hostname or "127.0.0.1", target.port or 5432,
                            pool_size=args.server_connections, prepared_statements=True) as bouncer:
        print(f"{bouncer.version()}: transaction pooling, {args.server_connections} server connections; "
              f"fleet {label(args.fleet)}, {args.runs} runs x 10 steps per round", flush=True)
        for i in range(args.rounds):
            for config in CONFIGS:
                configure(config, direct_url, bouncer)
                round_ = everystep_round(args.runs, args.fleet, args.poll, prefix="bench-pgbouncer")
                figures[config].append(round_)
            latest = {config: rounds[-1] for config, rounds in figures.items()}
            print(f"round {i + 1}: " + ", ".join(
                f"{config} {f['steps_per_s']:.0f} steps/s ({f['cpu_us_per_step']:.0f} us CPU/step)"
                for config, f in latest.items()), flush=True)
    medians = {config: {key: median(r[key] for r in rounds) for key in ("steps_per_s", "cpu_us_per_step")}
               for config, rounds in figures.items()}
    rate = {config: m["steps_per_s"] for config, m in medians.items()}
    result = {
        "medians": medians,
        "prepared_over_unprepared": rate["pgbouncer, prepared"] / rate["pgbouncer, unprepared"],
        "prepared_over_direct": rate["pgbouncer, prepared"] / rate["direct"],
        "unprepared_over_direct": rate["pgbouncer, unprepared"] / rate["direct"],
    }
    print(f"\nFleet {label(args.fleet)} straight and through PgBouncer ({args.server_connections} server "
          f"connections), median of {args.rounds} alternating rounds")
    print(table([[config, f"{m['steps_per_s']:.0f}", f"{m['cpu_us_per_step']:.0f} us"]
                 for config, m in medians.items()], ["configuration", "steps/s", "worker CPU / step"]))
    print(f"PgBouncer prepared / unprepared: {result['prepared_over_unprepared']:.2f}; "
          f"prepared / direct: {result['prepared_over_direct']:.2f}; "
          f"unprepared / direct: {result['unprepared_over_direct']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
