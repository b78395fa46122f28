"""Pages with big payloads, as Chromium loads them: the run page of a run whose
argument is a 5 MB catalogue, and the page of a step that returned 200,000
integers.

Makes one completed run in a database of its own on PostgreSQL: its argument
is a list of product records of about ``--arg-mb`` MB, step 1 received that
list, step 2 returned ``list(range(--integers))``. Serves the admin on a free
local port (Django's threaded WSGI server, ``DEBUG = False``, static files
served as the test live server serves them), logs a superuser in with
Debian's Chromium (Playwright, ``/usr/bin/chromium``), then ``--rounds`` times:

- opens the run page and the step 2 page: the bytes of the HTML, and from the
  start of the navigation, the time until the whole response has arrived
  (the server's share), until the load event, and until the first frame drawn
  after it (style and layout of the whole page done);
- on the run page, opens step 2's panel (htmx): the bytes of the fragment and
  the time from the click to the first frame after it is swapped in.

Prints the medians; asserts nothing about time. To measure other code on the
same data (an export of an older commit), copy this script into that checkout's
``bench/`` and run it there: it measures the code of the checkout it is in.

Usage: python bench/ui_payloads.py [--arg-mb 5] [--integers 200000] [--rounds 5] [--json FILE]
"""

import argparse
import json
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import setup, table  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# Set on every page before it loads: the time of the first frame after the load event.
FIRST_FRAME_AFTER_LOAD = """
addEventListener("load", () => requestAnimationFrame(() => setTimeout(() => {
    window.esFrameAfterLoad = performance.now();
})));
"""
# Opens a step's panel and resolves with the time to the first frame after htmx swapped it in.
OPEN_PANEL = """
(panelId) => new Promise((resolve) => {
    const panel = document.getElementById(panelId);
    const start = performance.now();
    panel.addEventListener("htmx:afterSettle", () => requestAnimationFrame(() => setTimeout(() => {
        const fetched = performance.getEntriesByType("resource").filter((e) => e.name.includes("/steps/"));
        resolve({ms: performance.now() - start, bytes: fetched.length ? fetched.at(-1).decodedBodySize : 0});
    })), {once: true});
    panel.querySelector("summary").click();
})
"""
PASSWORD = "bench-password"


def catalogue(megabytes: float) -> list[dict]:
    """Product records, about ``megabytes`` MB as JSON."""
    records, size = [], 0
    while size < megabytes * 1_000_000:
        i = len(records)
        record = {"sku": f"SKU-{i:07d}", "name": f"Product number {i}, in a plain box",
                  "price_cents": 199 + i % 5000, "stock": i % 17, "tags": ["catalogue", f"shelf-{i % 40}"]}
        records.append(record)
        size += len(json.dumps(record)) + 2
    return records


def make_run(megabytes: float, integers: int):
    """The run and its two steps; returns (run id, step 2 pk, bytes of the argument)."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from everystep.models import Step, Workflow

    get_user_model().objects.create_superuser("bench-admin", "bench@example.com", PASSWORD)
    records = catalogue(megabytes)
    now = timezone.now()
    run = Workflow.objects.create(
        name="bench.workflows.import_catalogue", args=[records], status=Workflow.Status.COMPLETED,
        claimed_by="bench", result={"imported": len(records), "ids": integers}, completed_at=now,
    )
    Step.objects.create(workflow=run, step_id="1", name="bench.steps.parse_catalogue", args=[records],
                        kwargs={}, status=Step.Status.DONE, result={"records": len(records)})
    ids = Step.objects.create(workflow=run, step_id="2", name="bench.steps.assign_ids", args=[len(records)],
                              kwargs={}, status=Step.Status.DONE, result=list(range(integers)))
    return str(run.pk), ids.pk, len(json.dumps([records]))


def serve():
    """The project on a free local port, on a thread; returns its base URL."""
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadedWSGIServer(("127.0.0.1", 0), QuietHandler, allow_reuse_address=False)
    server.set_app(StaticFilesHandler(get_wsgi_application()))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}"


def measure(base: str, run_id: str, step_pk: int, rounds: int) -> dict:
    from playwright.sync_api import sync_playwright

    run_url = f"{base}/admin/everystep/workflow/{run_id}/run/"
    step_url = f"{run_url}steps/{step_pk}/"
    samples = {"run page": [], "step page": [], "step panel (htmx)": []}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(300_000)
            page.add_init_script(FIRST_FRAME_AFTER_LOAD)
            page.goto(f"{base}/admin/login/")
            page.fill("#id_username", "bench-admin")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/")
            for _ in range(rounds):
                samples["run page"].append(load(page, run_url))
                samples["step page"].append(load(page, step_url))
                load(page, run_url)
                page.wait_for_function("() => window.htmx !== undefined")
                samples["step panel (htmx)"].append(
                    page.evaluate(OPEN_PANEL, f"es-step-{step_pk}")
                )
        finally:
            browser.close()
    return samples


def load(page, url: str) -> dict:
    response = page.goto(url, wait_until="load")
    if response.status != 200:
        raise RuntimeError(f"GET {url} answered {response.status}")
    page.wait_for_function("() => window.esFrameAfterLoad !== undefined")
    # The size as the browser received it (the inspector does not keep a body of many MB).
    timing = page.evaluate(
        "() => { const nav = performance.getEntriesByType('navigation')[0];"
        " return {bytes: nav.decodedBodySize, response: nav.responseEnd, load: nav.loadEventEnd,"
        " frame: window.esFrameAfterLoad}; }"
    )
    return {"bytes": timing["bytes"], "response_ms": timing["response"], "load_ms": timing["load"],
            "ms": timing["frame"]}


def ms(value) -> str:
    return "" if value is None else f"{value:.0f}"


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arg-mb", type=float, default=5)
    parser.add_argument("--integers", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    setup("ui_payloads")
    from django.conf import settings

    import everystep_ui

    settings.DEBUG = False
    run_id, step_pk, arg_bytes = make_run(args.arg_mb, args.integers)
    samples = measure(serve(), run_id, step_pk, args.rounds)
    figures, rows = {"_code": str(Path(everystep_ui.__file__).parent.parent)}, []
    for label, runs in samples.items():
        figure = {key: median([run[key] for run in runs]) for key in runs[0]}
        figures[label] = figure
        rows.append([label, f"{figure['bytes']:,}", ms(figure.get("response_ms")), ms(figure.get("load_ms")),
                     ms(figure["ms"])])
    print(f"\nPayload pages in Chromium: argument {arg_bytes / 1e6:.1f} MB, a step result of "
          f"{args.integers:,} integers; median of {args.rounds} rounds; code from {figures['_code']}")
    print(table(rows, ["page", "bytes", "response received ms", "load event ms", "first frame after ms"]))
    if args.json:
        Path(args.json).write_text(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
