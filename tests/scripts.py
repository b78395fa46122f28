"""Running the repository's scripts (bench/...) from a test."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_script(*argv: str, env: dict | None = None, timeout: float) -> subprocess.CompletedProcess:
    """``python <argv>`` from the repository root, its output captured. Past the
    timeout it gets SIGTERM, so that it stops what it started (worker
    processes, a throwaway server, scratch databases) before the test fails."""
    proc = subprocess.Popen(
        [sys.executable, *argv], cwd=ROOT, env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(f"{' '.join(argv)} did not finish in {timeout:.0f} s:\n{out}{err}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
