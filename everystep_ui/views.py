"""The run detail and step pages, served both in the admin and by ``everystep_ui.urls``.

Each view takes the ``WorkflowAdmin`` whose templates, queryset, permissions and
URL names it uses. A plain request gets the full page; an HTMX request gets the
partial (the run's live block while polling, a step's payloads when expanded).
"""

import datetime as dt
import uuid
from dataclasses import dataclass
from functools import partial, wraps
from urllib.parse import urlencode

from django.contrib.auth import REDIRECT_FIELD_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import TextField
from django.db.models.functions import Cast
from django.http import Http404, HttpResponse
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import reverse
from django_htmx.http import HttpResponseClientRedirect, HttpResponseStopPolling

from everystep import database, heartbeats, waits
from everystep.models import ChildRun, Heartbeat, RunFork, Step, Wait, Workflow

from . import display, tree
from .payloads import JSONHead, Preview, json_download

RUN_PAYLOADS = ("args", "result", "error")
STEP_PAYLOADS = ("args", "kwargs", "result", "error")
FORKS_SHOWN = 20  # a run page lists this many of the run's forks, oldest first
CHILDREN_SHOWN = 50  # and this many of its child runs
# What a run's completed_at is on its page. A blocked run has not ended: it waits
# for an operator since then, and is scheduled again once resolved.
END_LABELS = {"failed": "Failed at", "stopped": "Stopped at", "blocked": "Blocked since"}


def read_alias() -> str | None:
    """``EVERYSTEP_UI_READ_DATABASE``: the alias the pages read from (a
    streaming replica of everystep's database), or None for that database."""
    from django.conf import settings

    return getattr(settings, "EVERYSTEP_UI_READ_DATABASE", None)


def reading_replica(view):
    """Serve GET and HEAD requests from ``EVERYSTEP_UI_READ_DATABASE``: the
    pages and the action forms read there, rendered inside the block (a
    TemplateResponse renders after the view returns). Every other method
    (an action's POST, a bulk action) writes to everystep's database: an
    action's fence on the status the form saw (``seen_status``) then refuses
    it if the replica showed a state the primary has left."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        alias = read_alias()
        if alias is None or request.method not in ("GET", "HEAD"):
            return view(request, *args, **kwargs)
        with database.reading_from(alias):
            response = view(request, *args, **kwargs)
            if hasattr(response, "render") and not response.is_rendered:
                response.render()
        return response

    return wrapper


def staff_only(view, admin_site):
    """``admin_site.admin_view`` (active staff only, never cached), except that an
    HTMX request without a valid session gets a client redirect to the login
    page: htmx would follow a plain redirect and swap the login form into a
    fragment of the page."""
    protected = admin_site.admin_view(reading_replica(view))

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.htmx and not admin_site.has_permission(request):
            login_url = reverse("admin:login", current_app=admin_site.name)
            next_url = request.htmx.current_url_abs_path or request.get_full_path()
            query = urlencode({REDIRECT_FIELD_NAME: next_url})
            return HttpResponseClientRedirect(f"{login_url}?{query}")
        return protected(request, *args, **kwargs)

    return wrapper


def run_detail(request, run_id, *, model_admin):
    run = get_run(request, model_admin, run_id, payloads=True)
    context = run_context(request, model_admin, run)
    if request.htmx:
        html = render_to_string(model_admin.run_live_template, context, request)
        # 286 tells htmx to stop polling; the final state is still swapped in.
        return HttpResponse(html) if context["live"] else HttpResponseStopPolling(html)
    context.update(model_admin.admin_site.each_context(request), **lineage(request, model_admin, run))
    return TemplateResponse(request, model_admin.run_template, context)


def lineage(request, model_admin, run: Workflow) -> dict:
    """The run this one was forked from, the runs forked from it, its parent
    and its children (shown outside the polled block: the links do not change
    while the run runs; a child's status is as of the page's load)."""
    origin = RunFork.objects.filter(run_id=run.pk).values("origin_id", "origin_step_id").first()
    if origin is not None:
        origin_id = origin["origin_id"]
        origin = {
            "step_id": origin["origin_step_id"],
            "id": origin_id,
            "short_id": display.short_id(origin_id) if origin_id else "",
            "url": model_admin.page_url(request, "run", origin_id) if origin_id else "",
        }
    forks = list(
        RunFork.objects.filter(origin_id=run.pk)
        .order_by("created_at")
        .values_list("run_id", "origin_step_id", "run__status")[: FORKS_SHOWN + 1]
    )
    more = 0
    if len(forks) > FORKS_SHOWN:
        more = RunFork.objects.filter(origin_id=run.pk).count() - FORKS_SHOWN
        forks = forks[:FORKS_SHOWN]
    return {
        "forked_from": origin,
        "forks": [
            {
                "id": fork_id,
                "short_id": display.short_id(fork_id),
                "step_id": step_id,
                "status": status,
                "url": model_admin.page_url(request, "run", fork_id),
            }
            for fork_id, step_id, status in forks
        ],
        "more_forks": more,
        **family(request, model_admin, run),
    }


def family(request, model_admin, run: Workflow) -> dict:
    """The run that started this one with ``start_child``, and the child runs
    this one started, with their statuses (oldest first)."""
    link = ChildRun.objects.filter(child_id=run.pk).values("parent_id", "step_id", "parent__status").first()
    parent = None
    if link is not None:
        parent = {
            **_run_link(request, model_admin, link["parent_id"]),
            "step_id": link["step_id"],
            "status": link["parent__status"],
        }
    rows = list(
        ChildRun.objects.filter(parent_id=run.pk)
        .order_by("created_at", "child_id")
        .values_list("child_id", "step_id", "child__name", "child__status")[: CHILDREN_SHOWN + 1]
    )
    more = 0
    if len(rows) > CHILDREN_SHOWN:
        more = ChildRun.objects.filter(parent_id=run.pk).count() - CHILDREN_SHOWN
        rows = rows[:CHILDREN_SHOWN]
    return {
        "parent": parent,
        "children": [
            {**_run_link(request, model_admin, child_id), "step_id": step_id, "name": name, "status": status}
            for child_id, step_id, name, status in rows
        ],
        "more_children": more,
    }


def waiting_for(request, model_admin, run: Workflow) -> list[dict]:
    """What a ``waiting`` run waits for, one entry per wait row: ``kind``
    ``time`` (``until``), ``event`` (``key``, ``until``: its timeout, if
    any) or ``child`` (``child``: a link with the child's status). Empty for
    any other status (a run's wait rows go when it is woken)."""
    if run.status != Workflow.Status.WAITING:
        return []
    waits = Wait.objects.filter(run_id=run.pk).order_by("step_id")
    rows = list(waits.values("step_id", "kind", "key", "wake_at"))
    child_ids = [row["key"] for row in rows if row["kind"] == Wait.Kind.CHILD]
    statuses = {}
    if child_ids:
        statuses = dict(Workflow.objects.filter(id__in=child_ids).values_list("id", "status"))
    found = []
    for row in rows:
        entry = {"kind": row["kind"], "step_id": row["step_id"], "key": row["key"], "until": row["wake_at"]}
        if row["kind"] == Wait.Kind.CHILD:
            child_id = uuid.UUID(row["key"])
            entry["child"] = {**_run_link(request, model_admin, child_id), "status": statuses.get(child_id)}
        found.append(entry)
    return found


def _run_link(request, model_admin, run_id) -> dict:
    url = model_admin.page_url(request, "run", run_id)
    return {"id": run_id, "short_id": display.short_id(run_id), "url": url}


def step_detail(request, run_id, step_pk, *, model_admin):
    run = get_run(request, model_admin, run_id)
    step = get_step(run, step_pk, payloads=True)
    status = tree.step_status(step.status, run.status, step.name)
    uncertain = status == "uncertain"
    # In a blocked run's page (the panel htmx loads), the run's status says how to resolve it.
    resolve_on_run_page = uncertain and request.htmx and run.status == Workflow.Status.BLOCKED
    download_url = partial(model_admin.page_url, request, "run_step_json", run.pk, step.pk)
    payloads = previews(step, STEP_PAYLOADS, download_url)
    context = {
        "run": run,
        "step": step,
        "status": status,
        "status_label": tree.STATUS_LABELS.get(status, status),
        "args": payloads["args"],
        "kwargs": payloads["kwargs"],
        "result": payloads["result"] if status == "done" else None,
        "error": display.stored_error(payloads["error"]),
        "uncertain_step": step if uncertain else None,
        "resolve_command": (
            display.resolve_command(run.pk, step.step_id) if uncertain and not resolve_on_run_page else ""
        ),
        "resolve_on_run_page": resolve_on_run_page,
        "step_actions": model_admin.step_action_buttons(request, run, step.pk),
    }
    return page_or_fragment(
        request, model_admin, context,
        fragment=model_admin.step_payloads_template,
        page=model_admin.step_template,
        title=f"Step {step.step_id} of run {run.pk}",
        opts=Workflow._meta,
        **page_context(request, model_admin, run),
    )


def page_or_fragment(request, model_admin, context, *, fragment, page, **page_extra):
    """An HTMX request gets the fragment; any other the full admin page around it."""
    if request.htmx:
        return TemplateResponse(request, fragment, context)
    context.update(model_admin.admin_site.each_context(request), **page_extra)
    return TemplateResponse(request, page, context)


def payload_json(request, run_id, name, step_pk=None, *, model_admin):
    """A run's or a step's payload, whole, as the JSON download its preview links to."""
    run = get_run(request, model_admin, run_id)
    if name not in (STEP_PAYLOADS if step_pk is not None else RUN_PAYLOADS):
        raise Http404(f"There is no payload named {name!r}.")
    if step_pk is None:
        rows, filename = Workflow.objects.filter(pk=run.pk), f"run-{run.pk}-{name}.json"
    else:
        step = get_step(run, step_pk)
        rows, filename = Step.objects.filter(pk=step.pk), f"run-{run.pk}-step-{step.step_id}-{name}.json"
    # As text, as stored: not decoded into Python objects and encoded again.
    text = rows.values_list(Cast(name, TextField()), flat=True).get()
    return json_download(text, filename)


def get_run(request, model_admin, run_id, *, payloads=False) -> Workflow:
    """The run the URL names, or 403/404. With ``payloads``, its args, result and
    error come as ``payloads.JSONHead`` in ``args_head``, ``result_head``, ``error_head``."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    queryset = model_admin.get_queryset(request)
    if payloads:
        queryset = queryset.annotate(**{f"{name}_head": JSONHead(name) for name in RUN_PAYLOADS})
    run = queryset.filter(pk=parse_id(uuid.UUID, run_id)).first()
    if run is None:
        raise Http404("No run has this id.")
    if not model_admin.has_view_permission(request, run):
        raise PermissionDenied
    return run


def previews(row, names, url) -> dict[str, Preview]:
    """The payloads of a run or step read with ``payloads=True``, each linking to
    its download at ``url(name)``."""
    return {name: Preview.of(getattr(row, f"{name}_head"), url(name)) for name in names}


def get_step(run: Workflow, step_pk: str, *, payloads=False) -> Step:
    """The run's step the URL names, or 404; with ``payloads`` as for ``get_run``."""
    steps = Step.objects.filter(workflow_id=run.pk, pk=parse_id(int, step_pk)).defer(*STEP_PAYLOADS)
    if payloads:
        steps = steps.annotate(**{f"{name}_head": JSONHead(name) for name in STEP_PAYLOADS})
    step = steps.first()
    if step is None:
        raise Http404("This run has no such step.")
    return step


def parse_id(kind, text: str):
    """``kind(text)``, or 404 for a malformed id."""
    try:
        return kind(text)
    except ValueError:
        raise Http404(f"{text!r} is not a valid id.")


def run_context(request, model_admin, run: Workflow) -> dict:
    # Only the columns the tree shows, as plain rows: payloads load per step, on
    # demand, and a run can have thousands of steps.
    steps = list(
        Step.objects.filter(workflow_id=run.pk)
        .order_by("id")
        .values_list("id", "step_id", "name", "status", named=True)
    )
    intended, reason = [], ""
    if run.status != Workflow.Status.COMPLETED:
        intended, reason = tree.intended_steps(run.name)
    claimer = claimer_heartbeat(run)
    step_tree = tree.build_tree(steps, run.status, intended, claimer.executing if claimer else ())
    step_tree.intended_reason = reason
    # One reverse() for all steps: thousands of them would cost a noticeable share of the page.
    step_tree.step_url = model_admin.page_url(request, "run_step", run.pk, "STEP_PK")

    payloads = previews(run, RUN_PAYLOADS, partial(model_admin.page_url, request, "run_json", run.pk))
    error = display.stored_error(payloads["error"])
    uncertain = next(
        (row for row in steps if row.status == Step.Status.STARTED and not waits.is_wait_step(row.name)), None
    )
    show_resolve = run.status == Workflow.Status.BLOCKED or (error and error.is_uncertain)
    completed = run.status == Workflow.Status.COMPLETED
    return {
        "title": f"Run {run.pk}",
        "opts": Workflow._meta,
        "run": run,
        # Polled until the run has ended: a waiting run runs on when its wait
        # ends, so its page keeps polling too, less often (waits last long).
        "live": run.status not in Workflow.Status.terminal_values(),
        "poll_seconds": 15 if run.status == Workflow.Status.WAITING else 2,
        "end_label": END_LABELS.get(run.status, "Completed"),
        "duration": display.format_duration(run.completed_at - run.created_at if run.completed_at else None),
        "args": payloads["args"],
        "result": payloads["result"] if completed else None,
        "error": error,
        "uncertain_step": uncertain,
        "resolve_command": (
            display.resolve_command(run.pk, uncertain.step_id if uncertain else None) if show_resolve else ""
        ),
        "tree": step_tree,
        "claimer": claimer,
        "steps_recorded": len(steps),
        "waiting_for": waiting_for(request, model_admin, run),
        "action_buttons": model_admin.action_buttons(request, run),
        "step_actions": model_admin.step_action_buttons(request, run),
        **page_context(request, model_admin, run),
    }


@dataclass
class ClaimerHeartbeat:
    """The heartbeat of the worker running a run: how old it is, whether it is
    stale, and the run's steps it reported executing (none once stale)."""

    name: str
    age: str
    stale: bool
    executing: list[str]
    interval: str


def claimer_heartbeat(run: Workflow) -> ClaimerHeartbeat | None:
    """For a ``running`` run, its claimer's heartbeat (one query), else None.
    A run claimed by a worker that writes no heartbeat (an older version) has none."""
    if run.status != Workflow.Status.RUNNING or not run.claimed_by:
        return None
    beat = (
        Heartbeat.objects.with_age()
        .filter(name=run.claimed_by)
        .values_list("age", "executing")
        .first()
    )
    if beat is None:
        return None
    age, executing = beat
    stale = age.total_seconds() > heartbeats.shown_stale_after()
    return ClaimerHeartbeat(
        name=run.claimed_by,
        age=display.format_duration(max(age, dt.timedelta(0))),
        stale=stale,
        executing=[] if stale else _executing(executing, run),
        interval=f"{float(heartbeats.interval()):g} s",  # any real number the checks accept
    )


def _executing(executing, run: Workflow) -> list[str]:
    """The step ids a heartbeat reports running for ``run``: a worker writes
    ``{run id: [step ids]}``; a row of any other shape (another writer, a hand
    edit) reports none rather than break the page."""
    steps = executing.get(str(run.pk)) if isinstance(executing, dict) else None
    return [step for step in steps if isinstance(step, str)] if isinstance(steps, list) else []


def page_context(request, model_admin, run: Workflow) -> dict:
    """What both pages need: links, the run's short id, the partials' template names."""
    return {
        "run_url": model_admin.page_url(request, "run", run.pk),
        "changelist_url": model_admin.page_url(request, "changelist"),
        "overview_url": model_admin.page_url(request, "overview"),
        "run_short_id": display.short_id(run.pk),
        "run_live_template": model_admin.run_live_template,
        "step_payloads_template": model_admin.step_payloads_template,
    }
