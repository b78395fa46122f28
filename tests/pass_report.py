"""The closing summary of scripts/test.

As a pytest plugin (``-p tests.pass_report``), it writes what one pass did to
the JSON file ``$EVERYSTEP_TEST_REPORT``: its counts, and what became of the
browser tests (ran, skipped and why, or not selected). Run as
``python -m tests.pass_report DIR``, it prints the summary of the passes
scripts/test recorded in DIR (``NN.pass``: exit code, tab, label; ``NN.json``:
the pass's report, absent for a pass that was not pytest).
"""

import json
import os
import sys
from pathlib import Path

OUTCOMES = ("passed", "failed", "error", "skipped")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    path = os.environ.get("EVERYSTEP_TEST_REPORT")
    if not path:
        return
    stats = terminalreporter.stats
    browser = {outcome: 0 for outcome in OUTCOMES}
    reasons = []
    for outcome in OUTCOMES:
        for report in stats.get(outcome, []):
            if "browser" not in getattr(report, "keywords", {}):
                continue
            browser[outcome] += 1
            if outcome == "skipped" and isinstance(report.longrepr, tuple):
                reason = report.longrepr[2].removeprefix("Skipped: ")
                if reason not in reasons:
                    reasons.append(reason)
    report = {outcome: len(stats.get(outcome, [])) for outcome in OUTCOMES}
    Path(path).write_text(json.dumps({**report, "browser": browser, "browser_skip_reasons": reasons}))


def counts(report: dict) -> str:
    """``N passed, N failed, N skipped``: failed counts errors too, as tests that did not pass."""
    return (
        f"{report['passed']} passed, {report['failed'] + report['error']} failed, "
        f"{report['skipped']} skipped"
    )


def summarize(directory: Path) -> list[str]:
    lines, total = [], {outcome: 0 for outcome in OUTCOMES}
    browser = []
    for pass_file in sorted(directory.glob("*.pass")):
        code, label = pass_file.read_text().rstrip("\n").split("\t", 1)
        outcome = "ok" if code == "0" else f"FAILED, exit {code}"
        report_file = pass_file.with_suffix(".json")
        if not report_file.exists():
            lines.append(f"{label}: {outcome}")
            continue
        report = json.loads(report_file.read_text())
        lines.append(f"{label}: {outcome} ({counts(report)})")
        for outcome_name in OUTCOMES:
            total[outcome_name] += report[outcome_name]
        ran = report["browser"]
        if ran["passed"] or ran["failed"] or ran["error"]:
            browser.append(f"ran in the {label} pass ({counts(ran)})")
        elif ran["skipped"]:
            browser.append(
                f"skipped in the {label} pass ({ran['skipped']}): "
                + "; ".join(report["browser_skip_reasons"])
                + " (EVERYSTEP_REQUIRE_BROWSER=1 makes that a failure)"
            )
    if not browser:
        browser.append("not selected in any pass (-m or the paths given left them out)")
    lines.append("browser tests: " + "; ".join(browser))
    lines.append(f"total: {counts(total)}")
    return lines


if __name__ == "__main__":
    print("\n".join(summarize(Path(sys.argv[1]))))
