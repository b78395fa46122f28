"""Before/after: one benchmark script run alternately from two revisions.

Checks out ``--before`` (a git revision) in a temporary worktree, then runs the
given bench script there and in this checkout, alternating which goes first,
``--rounds`` times, each with ``--json``. Prints every numeric figure the
script reports: the median of each side, the after/before ratio, and each
round's values. A shared machine is noisy: read the ratio of medians.

Usage:
    python bench/ab.py --before f3af462 --rounds 5 -- step_overhead.py --steps 1000 --rounds 3
    python bench/ab.py --before main~3 -- throughput.py --no-dbos --runs 1000 --rounds 1
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def flatten(figures, prefix="") -> dict[str, float]:
    """Numeric leaves of a figures dict, keyed by their dotted path."""
    flat = {}
    for key, value in figures.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{path}."))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            flat[path] = float(value)
    return flat


def run(checkout: Path, script: list[str], out: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, f"bench/{script[0]}", *script[1:], "--json", str(out)],
        cwd=checkout, capture_output=True, text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: bench/{script[0]} failed:\n{done.stdout}\n{done.stderr}")
    return flatten(json.loads(out.read_text()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--before", required=True, help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...] under bench/")
    args = parser.parse_args(argv)
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script or args.rounds < 1:
        parser.error("name a bench script after --, and at least one round")
    with tempfile.TemporaryDirectory(prefix="everystep-ab-") as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(before), args.before],
                       cwd=ROOT, check=True)
        try:
            sides = {"before": [], "after": []}
            for i in range(args.rounds):
                order = [("before", before), ("after", ROOT)]
                for name, checkout in order if i % 2 == 0 else reversed(order):
                    sides[name].append(run(checkout, script, Path(tmp) / f"{name}-{i}.json"))
                    print(f"round {i + 1} {name}: done", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=True)
    print(f"bench/{' '.join(script)}: {args.before} (before) vs this checkout (after), "
          f"{args.rounds} alternating rounds, medians")
    keys = [key for key in sides["after"][0] if all(key in r for r in sides["before"] + sides["after"])]
    for key in keys:
        b = statistics.median(r[key] for r in sides["before"])
        a = statistics.median(r[key] for r in sides["after"])
        ratio = f"{a / b:.2f}" if b else "-"
        rounds = " / ".join(f"{r[key]:.4g}" for r in sides["before"]) + "  |  " + " / ".join(
            f"{r[key]:.4g}" for r in sides["after"])
        print(f"{key:40} before {b:10.4g}  after {a:10.4g}  after/before {ratio:>5}   ({rounds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
