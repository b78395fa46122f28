"""Payloads on the pages stay bounded, whatever their size: a preview (the start,
pretty-printed, with the size of the whole) and the whole value as a JSON download."""

import json
from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from django.db.models import JSONField
from django.test import Client
from hypothesis import given
from hypothesis import strategies as st

from everystep_ui.payloads import PREVIEW_CHARS, reindent

from .conftest import HTMX

# Comfortably above what a page with a few full previews weighs (about 25 KB for
# the run page below), far below the payloads: the pages must not grow with them.
PAGE_BOUND = 64_000
SCRIPT = "<script>alert(1)</script>"


def records(count: int) -> list[dict]:
    return [{"sku": f"SKU-{i:07d}", "name": f"Product {i}", "tags": ["a", "b"]} for i in range(count)]


BIG = records(80_000)  # about 5 MB as JSON
INTEGERS = list(range(200_000))


def run_page(run):
    return f"/admin/everystep/workflow/{run.pk}/run/"


def step_page(run, step):
    return f"{run_page(run)}steps/{step.pk}/"


@pytest.fixture
def big_run(make_run):
    """A completed run with a 5 MB argument, and a step that returned 200,000 integers."""
    run = make_run(
        status="completed",
        args=[BIG],
        result=INTEGERS,
        steps=[
            {"step_id": "1", "args": [BIG], "result": {"records": len(BIG)}},
            {"step_id": "2", "args": [len(BIG)], "result": INTEGERS},
        ],
    )
    assert len(json.dumps([BIG])) > 5_000_000
    return run


def record_values_read(monkeypatch) -> list[int]:
    """From now on, the size of every JSON value the ORM decodes."""
    sizes = []
    original = JSONField.from_db_value

    def recording(self, value, expression, connection):
        sizes.append(len(value) if isinstance(value, str) else len(json.dumps(value)))
        return original(self, value, expression, connection)

    monkeypatch.setattr(JSONField, "from_db_value", recording)
    return sizes


def test_pages_of_a_run_with_megabytes_of_payloads_stay_small(admin_client, big_run, monkeypatch):
    ids = step_page(big_run, big_run.steps.only("pk").get(step_id="2"))
    records = step_page(big_run, big_run.steps.only("pk").get(step_id="1"))
    values_read = record_values_read(monkeypatch)
    pages = {
        "run page": admin_client.get(run_page(big_run)),
        "run page poll": admin_client.get(run_page(big_run), **HTMX),
        "step page": admin_client.get(ids),
        "step panel": admin_client.get(ids, **HTMX),
        "step 1 panel": admin_client.get(records, **HTMX),
    }
    for name, response in pages.items():
        assert response.status_code in (200, 286), name
        assert len(response.content) < PAGE_BOUND, f"{name}: {len(response.content)} bytes"
    # No page read a payload whole: the database cut them.
    assert max(values_read, default=0) <= PREVIEW_CHARS


def test_a_page_does_not_grow_with_its_payload(admin_client, make_run):
    def page_size(count):
        run = make_run(status="completed", args=[records(count)], result=list(range(count)))
        return len(admin_client.get(run_page(run)).content)

    # The two runs differ in id and sizes shown only: the previews are the same.
    assert abs(page_size(2_000) - page_size(80_000)) < 50


def test_the_preview_shows_the_size_the_start_and_a_link_to_all_of_it(admin_client, big_run):
    html = admin_client.get(run_page(big_run)).text
    arguments = html.split("<h3>Arguments</h3>")[1].split("</pre>")[0]
    assert "5.3\xa0MB · <strong>the first 10,000 characters shown</strong>" in arguments
    download = f"/admin/everystep/workflow/{big_run.pk}/run/json/args/"
    assert f'<a href="{download}" download>raw JSON</a>' in arguments
    assert "[\n  [\n    {\n      &quot;sku&quot;: &quot;SKU-0000000&quot;," in arguments
    assert "SKU-0079999" not in html

    step = big_run.steps.get(step_id="2")
    panel = admin_client.get(step_page(big_run, step), **HTMX).text
    result = panel.split("<h4>result</h4>")[1]
    assert "1.4\xa0MB · <strong>the first 10,000 characters shown</strong>" in result
    assert "[\n  0,\n  1,\n  2," in result
    assert f'href="/admin/everystep/workflow/{big_run.pk}/run/steps/{step.pk}/json/result/"' in result


def test_a_small_payload_is_shown_whole_with_its_size(admin_client, make_run):
    run = make_run(status="completed", args=[{"order_id": 42}, "eu"], result={"charged": 1999})
    html = admin_client.get(run_page(run)).text
    assert "characters shown" not in html
    assert "[\n  {\n    &quot;order_id&quot;: 42\n  },\n  &quot;eu&quot;\n]" in html
    assert "{\n  &quot;charged&quot;: 1999\n}" in html
    assert "24\xa0bytes\n  · <a href=" in html


def test_non_ascii_text_shows_as_text(admin_client, make_run):
    run = make_run(status="completed", args=["Zoë", {"city": "Łódź"}], result="日本")
    html = admin_client.get(run_page(run)).text
    assert "&quot;Zoë&quot;" in html and "&quot;Łódź&quot;" in html and "&quot;日本&quot;" in html


# The download


def test_the_download_is_the_whole_value_as_json(admin_client, big_run):
    response = admin_client.get(f"{run_page(big_run)}json/args/")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="run-{big_run.pk}-args.json"'
    assert response["X-Content-Type-Options"] == "nosniff"
    assert json.loads(response.content) == [BIG]

    step = big_run.steps.get(step_id="2")
    response = admin_client.get(f"{step_page(big_run, step)}json/result/")
    assert response["Content-Disposition"] == f'attachment; filename="run-{big_run.pk}-step-2-result.json"'
    assert json.loads(response.content) == INTEGERS


@pytest.mark.parametrize(
    "step_id,in_name",
    [
        ("approve\nmanager", "approve_manager"),
        ("approve\rmanager", "approve_manager"),
        ('a "b"; c', "a__b___c"),
    ],
)
def test_the_download_name_holds_only_safe_characters(admin_client, make_run, step_id, in_name):
    # A step id may hold any character (everystep_id=): a line break would be
    # refused in the header (a 500), a quote would end the name early.
    run = make_run(status="completed", steps=[{"step_id": step_id, "result": {"ok": True}}])
    response = admin_client.get(f"{step_page(run, run.steps.get())}json/result/")
    assert response.status_code == 200
    name = f"run-{run.pk}-step-{in_name}-result.json"
    assert response["Content-Disposition"] == f'attachment; filename="{name}"'


def test_the_download_keeps_tagged_values_and_escapes_markup(admin_client, make_run):
    import datetime as dt

    when = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
    run = make_run(status="failed", args=[SCRIPT, when], error={"type": SCRIPT, "message": "&", "args": []})
    args = admin_client.get(f"{run_page(run)}json/args/")
    assert b"<" not in args.content and b">" not in args.content
    assert json.loads(args.content) == [SCRIPT, {"$es": "datetime", "v": "2024-05-01T12:00:00+00:00"}]
    error = admin_client.get(f"{run_page(run)}json/error/")
    assert b"&" not in error.content
    assert json.loads(error.content) == {"type": SCRIPT, "message": "&", "args": []}


def test_nothing_stored_downloads_as_null(admin_client, make_run):
    run = make_run(status="scheduled")
    assert admin_client.get(f"{run_page(run)}json/result/").content == b"null"


@pytest.mark.parametrize("mount", ["/admin/everystep/workflow/", "/everystep/"])
def test_the_download_needs_the_view_permission(operator_client, make_run, mount):
    run = make_run(status="completed", result={"secret": 1}, steps=[{"step_id": "1"}])
    step = run.steps.get()
    viewer = operator_client()
    unpermitted = Client()
    unpermitted.force_login(User.objects.create_user("staff", is_staff=True))
    for url in (f"{mount}{run.pk}/run/json/result/", f"{mount}{run.pk}/run/steps/{step.pk}/json/args/"):
        assert viewer.get(url).status_code == 200
        assert unpermitted.get(url).status_code == 403
        anonymous = Client().get(url)
        assert anonymous.status_code == 302
        assert anonymous["Location"] == f"/admin/login/?next={quote(url)}"


@pytest.mark.parametrize(
    "path",
    [
        "{run}/run/json/kwargs/",  # a step's payload, not a run's
        "{run}/run/json/name/",
        "{run}/run/steps/{step}/json/status/",
        "{run}/run/steps/999999/json/args/",
        "{other}/run/steps/{step}/json/args/",  # a step of another run
        "not-a-uuid/run/json/args/",
    ],
)
def test_unknown_payloads_are_not_found(admin_client, make_run, path):
    run = make_run(steps=[{"step_id": "1"}])
    other = make_run()
    url = "/admin/everystep/workflow/" + path.format(run=run.pk, step=run.steps.get().pk, other=other.pk)
    assert admin_client.get(url).status_code == 404


# Errors


def test_an_error_is_decoded_when_small_and_shown_as_stored_when_big(admin_client, make_run):
    small = make_run(status="failed", error={"type": "shop.Declined", "message": "card declined", "args": []})
    html = admin_client.get(run_page(small)).text
    assert "<code>shop.Declined</code>" in html
    assert f'href="/admin/everystep/workflow/{small.pk}/run/json/error/" download' in html

    huge = {"type": "shop.TooMuch", "message": "x" * 100, "args": [INTEGERS]}
    big = make_run(status="failed", error=huge)
    response = admin_client.get(run_page(big))
    assert len(response.content) < PAGE_BOUND
    assert "Too big to decode on this page" in response.text
    assert "the first 10,000 characters shown" in response.text


# The layout of a preview


def json_values():
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    scalars |= st.text()
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
        max_leaves=20,
    )


@given(json_values(), st.booleans())
def test_a_whole_value_is_laid_out_as_json_dumps_does(value, ascii_only):
    stored = json.dumps(value, ensure_ascii=ascii_only)  # SQLite and MariaDB hold \\u escapes
    expected = json.dumps(value, indent=2, ensure_ascii=False)
    assert reindent(stored, limit=10**9) == (expected, False)


@given(json_values(), st.integers(min_value=0, max_value=400))
def test_a_cut_preview_is_the_start_of_the_laid_out_value(value, limit):
    expected = json.dumps(value, indent=2, ensure_ascii=False)
    text, cut = reindent(json.dumps(value), limit=limit)
    assert text == expected[:limit]
    assert cut == (len(expected) > limit)


@given(json_values(), st.data())
def test_the_start_of_a_stored_value_shows_without_error(value, data):
    stored = json.dumps(value)
    head = stored[: data.draw(st.integers(min_value=0, max_value=len(stored)))]
    text, _ = reindent(head, limit=200)
    assert len(text) <= 200
    text.encode("utf-8")  # no lone surrogate from a cut escape


def test_deep_nesting_is_cut_at_the_bound():
    text, cut = reindent("[" * 50_000 + "]" * 50_000, limit=1_000)
    assert cut and len(text) == 1_000
