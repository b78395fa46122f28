"""A step's payloads: a fragment for htmx, a full page without it."""

import pytest

from .conftest import HTMX

SCRIPT = "<script>alert(1)</script>"


def step_page(run, step, mount="/admin/everystep/workflow/"):
    return f"{mount}{run.pk}/run/steps/{step.pk}/"


@pytest.fixture
def charged(make_run):
    run = make_run(
        status="completed",
        steps=[
            {
                "step_id": "3.0.1",
                "name": "shop.steps.charge",
                "args": [{"order_id": 42}],
                "kwargs": {"currency": "EUR"},
                "result": {"receipt": "r-1"},
            }
        ],
    )
    return run, run.steps.get()


def test_htmx_gets_the_payload_fragment(admin_client, charged):
    run, step = charged
    response = admin_client.get(step_page(run, step), **HTMX)
    assert response.status_code == 200
    html = response.text
    assert html.lstrip().startswith('<div class="es-step-payloads">')
    assert "<html" not in html
    assert "[\n  {\n    &quot;order_id&quot;: 42\n  }\n]" in html
    assert "{\n  &quot;currency&quot;: &quot;EUR&quot;\n}" in html
    assert "{\n  &quot;receipt&quot;: &quot;r-1&quot;\n}" in html
    assert "shop.steps.charge" in html


def test_without_htmx_the_step_is_a_full_admin_page(admin_client, charged):
    run, step = charged
    response = admin_client.get(step_page(run, step))
    assert response.status_code == 200
    html = response.text
    assert "Django administration" in html
    assert f"Step 3.0.1 of run {run.pk}" in html
    assert f'<a href="/admin/everystep/workflow/{run.pk}/run/">Back to the run</a>' in html
    assert "&quot;receipt&quot;" in html


def test_the_standalone_mount_serves_the_same_step_page(admin_client, charged):
    run, step = charged
    response = admin_client.get(step_page(run, step, mount="/everystep/"))
    assert response.status_code == 200
    assert f'<a href="/everystep/{run.pk}/run/">Back to the run</a>' in response.text


def test_a_failed_step_shows_its_error(admin_client, make_run):
    error = {"type": "builtins.ValueError", "message": "bad sku", "args": ["bad sku"]}
    run = make_run(status="failed", steps=[{"step_id": "1", "status": "failed", "error": error}])
    html = admin_client.get(step_page(run, run.steps.get()), **HTMX).text
    assert "builtins.ValueError" in html and "bad sku" in html
    assert "result" not in html.split("<h4>")[-1]


def test_a_terminal_step_shows_reason_and_payload(admin_client, make_run):
    error = {"type": "everystep.errors.Terminal", "message": "fraud", "args": ["fraud", [1, 2]]}
    run = make_run(status="stopped", steps=[{"step_id": "1", "status": "failed", "error": error}])
    html = admin_client.get(step_page(run, run.steps.get()), **HTMX).text
    assert '<th scope="row">Reason</th><td>fraud</td>' in html
    assert "[\n  1,\n  2\n]" in html


def test_an_uncertain_step_shows_the_resolve_command(admin_client, make_run):
    run = make_run(status="blocked", steps=[{"step_id": "ship", "status": "started"}])
    html = admin_client.get(step_page(run, run.steps.get())).text
    assert f"everystep_resolve_step {run.pk} ship (--result JSON" in html
    # Opened on the run page, whose status says it already, the panel points there.
    panel = admin_client.get(step_page(run, run.steps.get()), **HTMX).text
    assert "everystep_resolve_step" not in panel
    assert "how to resolve it is under Status, above" in panel


def test_a_started_step_of_a_running_run_is_in_flight(admin_client, make_run):
    run = make_run(status="running", steps=[{"step_id": "1", "status": "started"}])
    html = admin_client.get(step_page(run, run.steps.get()), **HTMX).text
    assert "in flight" in html
    assert "everystep_resolve_step" not in html


def test_step_payloads_render_inert(admin_client, make_run):
    run = make_run(
        steps=[
            {
                "step_id": "1",
                "name": SCRIPT,
                "args": [SCRIPT],
                "kwargs": {SCRIPT: SCRIPT},
                "result": SCRIPT,
            }
        ]
    )
    step = run.steps.get()
    for extra in ({}, HTMX):
        html = admin_client.get(step_page(run, step), **extra).text
        assert SCRIPT not in html
        assert "&lt;script&gt;" in html


def test_tagged_values_show_as_stored(admin_client, make_run):
    import datetime as dt

    when = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
    run = make_run(steps=[{"step_id": "1", "args": [when], "result": b"\x00\x01"}])
    html = admin_client.get(step_page(run, run.steps.get()), **HTMX).text
    assert "&quot;$es&quot;: &quot;datetime&quot;" in html
    assert "2024-05-01T12:00:00+00:00" in html
    assert "&quot;$es&quot;: &quot;bytes&quot;" in html


def test_a_step_of_another_run_is_not_found(admin_client, make_run, charged):
    _, step = charged
    other = make_run()
    assert admin_client.get(step_page(other, step)).status_code == 404
