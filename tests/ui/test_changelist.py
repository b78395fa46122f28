"""The run list: columns, order, filters, search, and its cost on big tables."""

import datetime as dt
import re
import uuid

import pytest
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from everystep import database
from everystep.models import Workflow
from everystep_ui import paginators
from everystep_ui.admin import WorkflowAdmin, id_prefix_range
from everystep_ui.paginators import EstimatedCountPaginator

from .conftest import CHECKOUT

LIST = "/admin/everystep/workflow/"


def listed_ids(response) -> list[str]:
    """Full run ids in the order the rows show them."""
    return re.findall(r'<td class="field-short_id"><a href="[^"]+" title="([^"]+)"', response.text)


def test_runs_newest_first_with_their_columns(admin_client, make_run):
    created = timezone.now() - dt.timedelta(minutes=5)
    first = make_run(
        status="completed",
        claimed_by="worker-7",
        created_at=created,
        completed_at=created + dt.timedelta(seconds=90),
        steps=[{"step_id": "1"}, {"step_id": "2"}],
    )
    second = make_run(status="running")
    third = make_run(status="failed")

    response = admin_client.get(LIST)

    assert response.status_code == 200
    assert listed_ids(response) == [str(third.pk), str(second.pk), str(first.pk)]
    row = response.text.split(f'title="{first.pk}"')[1].split("</tr>")[0]
    assert f"<code>{str(first.pk)[:8]}…{str(first.pk)[-4:]}</code>" in row
    assert CHECKOUT.replace(".", ".<wbr>") in row  # free to wrap at its dots
    assert '<span class="es-badge es-status-completed">completed</span>' in row
    assert "worker-7" in row
    end = timezone.localtime(first.completed_at)
    assert (
        f'<td class="field-completed"><time datetime="{end.isoformat()}" title="{end:%Y-%m-%d %H:%M:%S %Z}">'
        f'<span class="es-nowrap">{end:%Y-%m-%d}</span> <span class="es-nowrap">{end:%H:%M:%S}</span>'
        "</time></td>"
    ) in row
    assert "1 min 30 s" in row
    assert '<td class="field-steps_recorded">2</td>' in row
    assert f'href="/admin/everystep/workflow/{first.pk}/run/"' in response.text


def test_the_list_speaks_of_runs(admin_client, make_run):
    for _ in range(3):
        make_run()
    html = admin_client.get(LIST).text
    assert "<title>Select run to view | Django site admin</title>" in html
    assert "<h1>Select run to view</h1>" in html
    # The count closes the paginator (a <p> on Django 5.2, a <nav> on 6.x).
    assert re.search(r'class="paginator"[^>]*>(?:(?!</(?:p|nav)>).)*\n3 runs\n', html, re.S)
    # The breadcrumbs end with "Runs" (after &rsaquo; on Django 5.2, an <li> on 6.x).
    assert "&rsaquo; Runs\n</div>" in html or '<li aria-current="page">Runs</li>' in html
    index = admin_client.get("/admin/").text
    assert f'<a href="{LIST}">Runs</a>' in index


def test_a_blocked_run_is_listed_without_completion(admin_client, make_run):
    created = timezone.now() - dt.timedelta(minutes=5)
    run = make_run(status="blocked", created_at=created, completed_at=created + dt.timedelta(seconds=4))
    row = admin_client.get(LIST).text.split(f'title="{run.pk}"')[1].split("</tr>")[0]
    assert '<td class="field-completed">—</td>' in row
    assert '<td class="field-duration">—</td>' in row


def test_each_row_has_the_admins_own_action_checkbox(admin_client, make_run):
    # WorkflowAdmin writes the checkbox without the form renderer, for speed; it
    # must stay the markup Django's admin JavaScript and bulk actions expect.
    from django.contrib import admin as django_admin

    run = make_run(name="shop.<b>checkout</b>")
    response = admin_client.get(LIST)
    model_admin = django_admin.site.get_model_admin(Workflow)
    expected = django_admin.ModelAdmin.action_checkbox(model_admin, run)
    assert f'<td class="action-checkbox">{expected}</td>' in response.text
    assert "shop.&lt;b&gt;checkout&lt;/b&gt;" in expected


def test_the_list_does_not_count_the_whole_table_twice(admin_client, make_run):
    make_run()
    response = admin_client.get(LIST)
    # show_full_result_count = False: "N results (M total)" would cost a second COUNT(*).
    assert "total" not in response.text.split('id="changelist-search"')[1].split("</form>")[0]


def test_query_count_does_not_grow_with_rows(admin_client, make_run, django_assert_max_num_queries):
    make_run(steps=[{"step_id": "1"}])
    admin_client.get(LIST)  # warm caches (content types, permissions)
    with CaptureQueriesContext(database.connection()) as few:
        admin_client.get(LIST)

    for index in range(40):
        make_run(status="completed", steps=[{"step_id": str(n)} for n in range(1, index % 4 + 2)])
    with django_assert_max_num_queries(len(few.captured_queries)):
        response = admin_client.get(LIST)
    assert len(listed_ids(response)) == 41


def test_the_list_query_leaves_payload_columns_out(admin_client, make_run):
    make_run(args=[{"big": "x" * 1000}])
    with CaptureQueriesContext(database.connection()) as queries:
        admin_client.get(LIST)
    table = database.connection().ops.quote_name("everystep_workflow")
    run_queries = [q["sql"] for q in queries.captured_queries if f"FROM {table}" in q["sql"]]
    assert run_queries
    for column in ("args", "result", "error"):
        selected = f"{table}.{database.connection().ops.quote_name(column)}"
        assert not any(selected in sql for sql in run_queries)


# Filters


@pytest.fixture
def runs(make_run):
    now = timezone.now()
    return {
        "old_failed": make_run(
            status="failed",
            claimed_by="worker-a",
            created_at=now - dt.timedelta(days=10),
            args=[{"order_id": 42, "tags": ["vip"]}, "eu"],
        ),
        "keyed": make_run(
            name="shop.workflows.refund",
            status="completed",
            claimed_by="worker-b",
            idempotency_key="refund-9",
            args=[{"order_id": 7}],
        ),
        "fresh": make_run(status="scheduled", args=[42, True]),
    }


def listed(admin_client, query):
    response = admin_client.get(LIST, query)
    assert response.status_code == 200
    return set(listed_ids(response))


def ids(*rows):
    return {str(row.pk) for row in rows}


def test_filter_by_status(admin_client, runs):
    assert listed(admin_client, {"status": "failed"}) == ids(runs["old_failed"])


def test_filter_by_workflow_name_from_the_registry(admin_client, runs, monkeypatch):
    from everystep import registry

    monkeypatch.setattr(registry, "workflow_names", lambda: [CHECKOUT, "shop.workflows.refund"])
    response = admin_client.get(LIST)
    assert '<option value="shop.workflows.refund">' in response.text
    assert listed(admin_client, {"name": "shop.workflows.refund"}) == ids(runs["keyed"])


def test_filter_by_claimer(admin_client, runs):
    assert listed(admin_client, {"claimed_by": "worker-b"}) == ids(runs["keyed"])


def test_filter_by_created_date_range(admin_client, runs):
    today = timezone.localdate()
    recent = ids(runs["keyed"], runs["fresh"])
    assert listed(admin_client, {"created_after": today.isoformat()}) == recent
    before = (today - dt.timedelta(days=5)).isoformat()
    assert listed(admin_client, {"created_before": before}) == ids(runs["old_failed"])
    both = {"created_after": before, "created_before": today.isoformat()}
    assert listed(admin_client, both) == recent


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "America/New_York"])
def test_the_first_and_last_days_of_the_calendar_leave_every_run_in(admin_client, runs, zone):
    # The date input offers them. The day after 9999-12-31 does not exist, and
    # east of UTC 0001-01-01 starts in year 0 in UTC: no bound is needed there.
    for bound in ({"created_before": "9999-12-31"}, {"created_after": "0001-01-01"}):
        with override_settings(TIME_ZONE=zone):
            response = admin_client.get(LIST, bound)
        assert response.status_code == 200
        assert "was not applied" not in response.text
        assert set(listed_ids(response)) == ids(*runs.values())


def test_filter_by_having_an_idempotency_key(admin_client, runs):
    assert listed(admin_client, {"has_idempotency_key": "true"}) == ids(runs["keyed"])
    unkeyed = ids(runs["old_failed"], runs["fresh"])
    assert listed(admin_client, {"has_idempotency_key": "false"}) == unkeyed


@pytest.mark.parametrize(
    ("needle", "expected"),
    [
        ('{"order_id": 42}', ["old_failed"]),
        ('{"order_id": 7}', ["keyed"]),
        ('[{"order_id": 42}, "eu"]', ["old_failed"]),
        ('{"tags": ["vip"]}', ["old_failed"]),
        ("42", ["fresh"]),
        ("true", ["fresh"]),
        ("1", []),
        ('{"order_id": 43}', []),
        ("  ", ["old_failed", "keyed", "fresh"]),
    ],
)
def test_filter_by_argument_json_containment(admin_client, runs, needle, expected):
    assert listed(admin_client, {"args": needle}) == ids(*(runs[name] for name in expected))


def test_invalid_argument_json_is_reported_and_not_applied(admin_client, runs):
    response = admin_client.get(LIST, {"args": "{order_id: 42"})
    assert response.status_code == 200
    assert "The filter “Argument contains” was not applied: Enter valid JSON, for example" in response.text
    assert "{&quot;order_id&quot;: 42}" in response.text
    # Not applied means the list is what it would be without it.
    assert set(listed_ids(response)) == ids(*runs.values())
    # The form keeps what the user typed so it can be corrected.
    assert 'value="{order_id: 42"' in response.text


@pytest.mark.parametrize(
    "needle",
    ["NaN", "Infinity", "-Infinity", "1e400", '{"amount": 1e999}']
    + ['"\\u0000"', '{"note": "a\\u0000b"}', '"\\ud800"'],
)
def test_json_no_argument_can_hold_is_reported_and_not_applied(admin_client, runs, needle):
    # json.loads takes non-finite numbers (1e400 is inf), NUL and lone
    # surrogates; everystep stores none of them (nor does PostgreSQL's jsonb).
    response = admin_client.get(LIST, {"args": needle})
    assert response.status_code == 200
    assert "The filter “Argument contains” was not applied: Enter a value a run" in response.text
    assert set(listed_ids(response)) == ids(*runs.values())


def test_the_valid_filters_apply_next_to_an_invalid_one(admin_client, runs):
    query = {"args": "{order_id: 42", "status": "completed", "claimed_by": "worker-b"}
    response = admin_client.get(LIST, query)
    assert "The filter “Argument contains” was not applied" in response.text
    assert set(listed_ids(response)) == ids(runs["keyed"])


def test_an_unknown_status_is_refused_with_a_message(admin_client, runs):
    response = admin_client.get(LIST, {"status": "exploded"})
    assert response.status_code == 200
    assert "The filter “Status” was not applied: Select a valid choice." in response.text
    assert set(listed_ids(response)) == ids(*runs.values())


def test_filters_are_combined_and_keep_the_search(admin_client, runs):
    response = admin_client.get(LIST, {"q": "shop", "status": "completed", "claimed_by": ""})
    assert set(listed_ids(response)) == ids(runs["keyed"])
    assert '<input type="hidden" name="q" value="shop">' in response.text


def test_changelist_filters_on_the_standalone_mount(admin_client, runs):
    response = admin_client.get("/everystep/", {"args": '{"order_id": 42}'})
    assert response.status_code == 200
    assert listed_ids(response) == [str(runs["old_failed"].pk)]
    assert f'href="/everystep/{runs["old_failed"].pk}/run/"' in response.text


# Search


def test_search_by_id_prefix_name_or_idempotency_key(admin_client, make_run):
    a = make_run(id=uuid.UUID("0190aaaa-0000-7000-8000-000000000001"), idempotency_key="k-1")
    b = make_run(id=uuid.UUID("0190bbbb-0000-7000-8000-000000000002"), name="billing.flows.invoice")
    assert listed(admin_client, {"q": "0190aa"}) == ids(a)
    assert listed(admin_client, {"q": "0190BBBB-0000"}) == ids(b)
    assert listed(admin_client, {"q": str(b.pk)}) == ids(b)
    assert listed(admin_client, {"q": "invoice"}) == ids(b)
    assert listed(admin_client, {"q": "k-1"}) == ids(a)
    assert listed(admin_client, {"q": "nothing-like-it"}) == set()


def test_id_prefix_becomes_a_primary_key_range():
    low, high = id_prefix_range("0190-ab")
    assert str(low) == "0190ab00-0000-0000-0000-000000000000"
    assert str(high) == "0190abff-ffff-ffff-ffff-ffffffffffff"
    assert id_prefix_range("not hex") is None
    assert id_prefix_range("0" * 33) is None


# Counting


@pytest.mark.django_db
def test_paginator_uses_the_estimate_only_for_a_big_unfiltered_table(monkeypatch, make_run):
    for _ in range(3):
        make_run()
    monkeypatch.setattr(paginators, "estimated_row_count", lambda queryset: 2_000_000)
    assert EstimatedCountPaginator(Workflow.objects.all(), 100).count == 2_000_000
    filtered = Workflow.objects.filter(status="scheduled")
    assert EstimatedCountPaginator(filtered, 100).count == 3

    monkeypatch.setattr(paginators, "estimated_row_count", lambda queryset: 50)
    assert EstimatedCountPaginator(Workflow.objects.all(), 100).count == 3

    monkeypatch.setattr(paginators, "estimated_row_count", lambda queryset: None)
    assert EstimatedCountPaginator(Workflow.objects.all(), 100).count == 3


@pytest.mark.django_db
@pytest.mark.django_db
def test_an_estimate_below_the_real_count_leaves_no_run_on_no_page(monkeypatch, make_run):
    # reltuples lags a growing table until the next ANALYZE: the pages past
    # the estimate were refused, so the oldest runs were on no page.
    runs = [make_run(status="completed") for _ in range(15)]
    monkeypatch.setattr(EstimatedCountPaginator, "estimate_threshold", 5)
    monkeypatch.setattr(paginators, "estimated_row_count", lambda queryset: 10)
    paginator = EstimatedCountPaginator(Workflow.objects.order_by("-id"), 5)
    assert (paginator.count, paginator.num_pages) == (10, 2)
    assert len(paginator.page(1)) == 5 and paginator.count == 10  # the head: the estimate
    assert [run.pk for run in paginator.page(3)] == [run.pk for run in reversed(runs[:5])]  # the oldest
    assert (paginator.count, paginator.num_pages) == (15, 3)  # exact from there on


def test_a_filtered_list_matching_many_rows_uses_the_plans_estimate(monkeypatch, make_run):
    for _ in range(3):
        make_run()
    filtered = Workflow.objects.filter(status="scheduled")
    monkeypatch.setattr(paginators, "estimated_match_count", lambda queryset: 800_000)
    assert EstimatedCountPaginator(filtered, 100).count == 800_000
    monkeypatch.setattr(paginators, "estimated_match_count", lambda queryset: 40)
    assert EstimatedCountPaginator(filtered, 100).count == 3
    monkeypatch.setattr(paginators, "estimated_match_count", lambda queryset: None)
    assert EstimatedCountPaginator(filtered, 100).count == 3


@pytest.mark.django_db
def test_the_plans_estimate_is_postgresql_only(make_run):
    for _ in range(3):
        make_run(status="failed")
    estimate = paginators.estimated_match_count(Workflow.objects.filter(status="failed"))
    if database.connection().vendor == "postgresql":
        assert isinstance(estimate, int) and estimate >= 1
    else:
        assert estimate is None


@pytest.mark.django_db
def test_estimate_is_postgresql_only():
    estimate = paginators.estimated_row_count(Workflow.objects.all())
    if database.connection().vendor == "postgresql":
        assert estimate is None or estimate >= 0
    else:
        assert estimate is None


def test_an_estimated_count_shows_in_the_list(admin_client, make_run, monkeypatch):
    make_run()
    monkeypatch.setattr(paginators, "estimated_row_count", lambda queryset: 1_234_567)
    response = admin_client.get(LIST)
    assert "1234567 runs" in response.text


# Read-only


def test_nobody_adds_changes_or_deletes_runs_in_the_admin(admin_client, make_run):
    run = make_run()
    assert admin_client.get(LIST + "add/").status_code == 403
    assert admin_client.post(f"{LIST}{run.pk}/delete/").status_code == 403
    change = admin_client.get(f"{LIST}{run.pk}/change/")
    assert change.status_code == 302
    assert change["Location"] == f"{LIST}{run.pk}/run/"
    assert Workflow.objects.filter(pk=run.pk).exists()
    # The only bulk actions are the operator's (tests/ui/test_bulk_actions.py), never delete.
    actions = admin_client.get(LIST).text.split('<select name="action"')[1].split("</select>")[0]
    assert re.findall(r'<option value="(\w*)"', actions) == ["", "retry_selected", "stop_selected"]


def test_argument_contains_finds_a_tagged_argument_as_the_run_page_shows_it(admin_client, make_run):
    # The stored form, pasted from the run page: it was stored again wrapped
    # as a dict ({"$es": "dict", ...}) and matched nothing.
    order = uuid.UUID("12345678-1234-5678-1234-567812345678")
    run = make_run(status="completed", args=[order])
    assert "&quot;$es&quot;: &quot;uuid&quot;" in admin_client.get(f"{LIST}{run.pk}/run/").text
    needle = '{"$es": "uuid", "v": "12345678-1234-5678-1234-567812345678"}'
    assert listed(admin_client, {"args": needle}) == ids(run)


def test_the_overviews_link_to_a_claimer_with_edge_spaces_lists_its_runs(admin_client, make_run):
    import html

    run = make_run(status="running", claimed_by=" worker-2 ")
    overview = admin_client.get(f"{LIST}overview/").text
    link = re.findall(r'href="(/admin/everystep/workflow/\?[^"]*claimed_by=[^"]*)"', overview)[0]
    assert set(listed_ids(admin_client.get(html.unescape(link)))) == ids(run)  # the filter stripped it


def test_search_compares_an_idempotency_key_exactly_spaces_and_all(admin_client, make_run):
    spaced = make_run(status="completed", idempotency_key="order-7 ")
    make_run(status="completed", idempotency_key="order-7")
    assert listed(admin_client, {"q": "order-7 "}) == ids(spaced)  # it listed the other run


def test_the_run_list_opens_with_use_tz_false(settings, admin_client, make_run):
    settings.USE_TZ = False  # it was a 500: localtime() cannot be applied to a naive datetime
    now = dt.datetime.now()
    run = make_run(status="completed", created_at=now - dt.timedelta(seconds=5), completed_at=now)
    assert listed(admin_client, {}) == ids(run)


@pytest.mark.django_db
def test_the_last_page_an_estimate_above_the_count_offers_still_opens(monkeypatch, admin_client, make_run):
    # The estimate overshoots (rows deleted since the last ANALYZE): the
    # paginator offers pages up to the estimate's last; following the link to
    # it must not throw the operator out of the list (it showed the page,
    # empty, before the count was made exact there).
    for _ in range(6):
        make_run(status="completed")
    monkeypatch.setattr(WorkflowAdmin, "list_per_page", 2)
    monkeypatch.setattr(EstimatedCountPaginator, "estimate_threshold", 5)
    monkeypatch.setattr(paginators, "estimated_row_count", lambda queryset: 10)
    first = admin_client.get(LIST)
    assert first.status_code == 200
    assert "?p=5" in first.text  # the estimate's last page is offered
    last = admin_client.get(LIST + "?p=5")
    assert last.status_code == 200, (last.status_code, last.get("Location"))
    assert len(listed_ids(last)) == 2  # the real last page


def test_argument_contains_imports_no_module_an_enum_tag_names(admin_client, make_run, tmp_path, monkeypatch):
    # Decoding a typed tag imported the module it named, running its code for
    # anyone who may view the list; an enum the process has imported is found.
    import sys

    (tmp_path / "filter_probe_module.py").write_text("import sys\nsys.filter_probe_imported = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    response = admin_client.get(LIST, {"args": '{"$es": "enum", "cls": "filter_probe_module.Mood", "v": 1}'})
    assert "not one this process has imported" in response.text
    assert not hasattr(sys, "filter_probe_imported")
    run = make_run(status="completed", args=[Workflow.Status.FAILED])
    tag = '{"$es": "enum", "cls": "everystep.statuses.RunStatus", "v": "failed"}'
    assert listed(admin_client, {"args": tag}) == ids(run)

