"""Operator actions on runs: Retry, Stop, Resolve, Requeue, Wake now, Send
event, and from a step: Re-run from here, Fork from here.

Each calls its transition in ``everystep.operations`` (``everystep.history``
for the two step actions), conditional on the status the operator saw (and,
from a step, on the step rows shown), records a ``LogEntry`` on the run's
admin history and reports through the admin's messages. ``run_action`` serves
every single-run action (GET shows the confirmation and changes nothing, POST
acts); Retry and Stop are also bulk actions of the run list, with a
confirmation page modelled on Django's ``delete_selected``.
"""

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django_htmx.http import HttpResponseClientRedirect

from everystep import children, database, history, operations, serde, waits
from everystep.errors import EverystepError, RefusedByDatabase
from everystep.models import Step, Workflow

from . import display, views
from .forms import (
    ForkForm,
    RequeueForm,
    ResolveForm,
    RetryForm,
    RunActionForm,
    SendEventForm,
    StepCutForm,
    StopForm,
    WakeForm,
)

Status = Workflow.Status
BULK_REFUSALS_SHOWN = 5
WAIT_ACTIONS = ("wake", "send_event")  # their confirmation shows what the run waits for


# ---------------------------------------------------------------- the transitions


def _retry(request, run, seen, form) -> str:
    mark = form.cleaned_data["seen_mark"] if form is not None else None  # bulk: the status only
    discarded = operations.retry_run(run.pk, expected_status=seen, expected_mark=mark)
    return f"Retried: {seen} -> {Status.SCHEDULED}; {describe_discarded(discarded)}."


def _stop(request, run, seen, form) -> str:
    actor = request.user.get_username()
    operations.stop_run(run.pk, actor=actor, expected_status=seen)
    change = f"Stopped: {seen} -> {Status.STOPPED}."
    if form is None or not form.cleaned_data.get("stop_children"):
        return change
    form.stopped_children = children.stop_descendants(run.pk, actor=actor)
    count = len(form.stopped_children)
    return f"{change[:-1]}; also stopped {count} child run{'s' if count != 1 else ''}."


def _after_stop(request, model_admin, run, form) -> str:
    """Each child run stopped with its parent says so in its own history."""
    for child_id, before in getattr(form, "stopped_children", ()):
        child = Workflow.objects.get(pk=child_id)
        model_admin.log_change(
            request, child, f"Stopped with run {run.pk}: {before} -> {Status.STOPPED}."
        )
    return model_admin.page_url(request, "run", run.pk)


def _wake(request, run, seen, form) -> str:
    mark = form.cleaned_data["seen_mark"]
    operations.wake_now(run.pk, actor=request.user.get_username(), expected_mark=mark)
    return f"Woken now: {seen} -> {Status.SCHEDULED}."


def _send_event(request, run, seen, form) -> str:
    key, value = form.cleaned_data["key"], form.cleaned_data["value"]
    # The send and the status it left, in one transaction: the message says what it did.
    with database.atomic():
        stored = waits.send_event(run.pk, key, value)
        status = Workflow.objects.filter(pk=run.pk).values_list("status", flat=True).get()
    if not stored:  # not a change: a warning, and nothing in the run's history
        raise EverystepError(
            f"Run {run.pk}: event {key!r} was sent before: the first value is kept, this one was not stored."
        )
    sent = f"Sent event {key!r} with the value {_clip(serde.dumps(value))}"
    if status != seen:
        return f"{sent}: {seen} -> {status}."
    return f"{sent}; the run does not wait for it yet, it is kept until it does."


def _requeue(request, run, seen, form) -> str:
    claimer = form.cleaned_data["seen_claimer"] or None
    operations.requeue_run(run.pk, expected_status=seen, expected_claimer=claimer)
    fenced = f" (claimer {claimer or run.claimed_by} fenced out)" if claimer or run.claimed_by else ""
    return f"Requeued: {seen} -> {Status.SCHEDULED}{fenced}."


def _resolve(request, run, seen, form) -> str:
    # resolve_step checks the blocked status and the started rows shown itself,
    # under a lock on the run row.
    step_id = form.cleaned_data["step_id"]
    resolution = form.resolve_kwargs()
    operations.resolve_step(run.pk, step_id, expected_mark=form.cleaned_data["seen_mark"], **resolution)
    if "result" in resolution:
        how = f"recorded as done with the result {_clip(form.cleaned_data['result'].strip())}"
    elif "error" in resolution:
        how = f"recorded as failed with the message {_clip(resolution['error'])!r}"
    else:
        how = "its started row discarded, so that it runs again"
    return f"Resolved step {step_id}: {how}; {seen} -> {Status.SCHEDULED}."


def _rerun(request, run, seen, form) -> str:
    cut = history.rerun_from_step(run.pk, form.step.step_id, **form.seen_cut(seen))
    return f"Re-ran from step {cut.step.step_id}: {seen} -> {Status.SCHEDULED}; {describe_cut(cut)}."


def _fork(request, run, seen, form) -> str:
    fork, cut = history.fork_from_step(run.pk, form.step.step_id, **form.seen_cut(seen))
    form.forked = fork
    copied = f"copied {len(cut.kept)} step row{'s' if len(cut.kept) != 1 else ''}"
    left_out = describe_cut(cut, "left out")
    return f"Forked from step {cut.step.step_id} into run {fork.pk}: {copied}; {left_out}."


def _after_fork(request, model_admin, run, form) -> str:
    """The fork's own history starts with where it came from; the browser goes there."""
    fork = form.forked
    model_admin.log_addition(request, fork, f"Forked from run {run.pk} at step {form.step.step_id}.")
    return model_admin.page_url(request, "run", fork.pk)


def describe_cut(cut, done: str = "discarded") -> str:
    rows = ", ".join(
        f"{row.step_id} {row.name} ({row.status}{', ' + row.unsafe if row.unsafe else ''})"
        for row in cut.discarded
    )
    count = len(cut.discarded)
    return f"{done} {count} step row{'s' if count > 1 else ''}: {rows}"


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_discarded(discarded) -> str:
    if not discarded:
        return "no step row discarded"
    rows = ", ".join(
        f"{row.step_id} {row.name} ({row.status}{', ' + row.unsafe if row.unsafe else ''})"
        for row in discarded
    )
    return f"discarded {len(discarded)} step row{'s' if len(discarded) > 1 else ''}: {rows}"


@dataclass(frozen=True)
class RunAction:
    name: str  # URL segment; permission ``everystep.<name>_workflow``, checked by ``has_<name>_permission``
    label: str
    done: str  # "a failed run can be <done>"
    allowed_from: tuple[str, ...]
    perform: Callable  # (request, run, seen status, form) -> the change, for the log and the message
    form_class: type[RunActionForm] = RunActionForm
    # From a step: offered on each recorded step, previewed by preview(run id, step id).
    preview: Callable | None = None
    # (request, model_admin, run, form) -> the URL to go to once done (default: the run page).
    after: Callable | None = None
    # The form's field of the value the action stores: the database's refusal of it is shown there.
    value_field: str | None = None

    @property
    def per_step(self) -> bool:
        return self.preview is not None


ACTIONS = {
    action.name: action
    for action in [
        RunAction("retry", "Retry", "retried", operations.RETRYABLE, _retry, RetryForm),
        RunAction("stop", "Stop", "stopped", operations.STOPPABLE, _stop, StopForm, after=_after_stop),
        RunAction(
            "resolve", "Resolve", "resolved", (Status.BLOCKED,), _resolve, ResolveForm, value_field="result"
        ),
        RunAction("requeue", "Requeue", "requeued", operations.REQUEUEABLE, _requeue, RequeueForm),
        RunAction("wake", "Wake now", "woken", (Status.WAITING,), _wake, WakeForm),
        RunAction(
            "send_event", "Send event", "sent an event", (Status.WAITING,), _send_event, SendEventForm,
            value_field="value",
        ),
        RunAction(
            "rerun", "Re-run from here", "re-run from a step", history.RERUNNABLE, _rerun, StepCutForm,
            preview=history.rerun_preview,
        ),
        RunAction(
            "fork", "Fork from here", "forked", history.FORKABLE, _fork, ForkForm,
            preview=history.fork_preview, after=_after_fork,
        ),
    ]
}


def may(request, model_admin, action: RunAction, run=None) -> bool:
    return getattr(model_admin, f"has_{action.name}_permission")(request, run)


def available(request, model_admin, run) -> list[dict]:
    """The buttons of the run page: actions its status allows and the user may take."""
    return [
        {"action": action, "url": model_admin.page_url(request, f"run_{action.name}", run.pk)}
        for action in ACTIONS.values()
        if not action.per_step
        and run.status in action.allowed_from
        and may(request, model_admin, action, run)
    ]


def available_from_step(request, model_admin, run, step_pk=None) -> list[dict]:
    """The actions each recorded step offers (its status allows them, the user
    may take them); with ``step_pk``, their URLs for that step."""
    return [
        {
            "action": action,
            "url": model_admin.page_url(request, f"run_{action.name}", run.pk, step_pk) if step_pk else "",
        }
        for action in ACTIONS.values()
        if action.per_step and run.status in action.allowed_from and may(request, model_admin, action, run)
    ]


# ---------------------------------------------------------------- one run


def run_action(request, run_id, *, model_admin, action_name, step_pk=None):
    action = ACTIONS[action_name]
    try:
        run = views.get_run(request, model_admin, run_id)
    except Http404:
        if request.method != "POST" or not may(request, model_admin, action):
            raise
        return _run_gone(request, model_admin, run_id, step_pk)
    if not may(request, model_admin, action, run):
        raise PermissionDenied
    run_url = model_admin.page_url(request, "run", run.pk)
    posted = request.POST if request.method == "POST" else None
    step, cut = None, None
    if action.per_step:
        steps = Step.objects.filter(workflow_id=run.pk).only("step_id")
        step = steps.filter(pk=views.parse_id(int, step_pk)).first()
        if step is None and posted is None:
            raise Http404("This run has no such step.")
        try:
            if step is None:  # it was there when the confirmation was shown
                raise EverystepError(
                    f"Run {run.pk} moved on: the step row you chose is no longer recorded; "
                    "nothing was changed."
                )
            if run.status in action.allowed_from:
                cut = action.preview(run.pk, step.step_id)
        except EverystepError as exc:  # the run moved on since it was read above
            model_admin.message_user(request, str(exc), messages.WARNING)
            return _back_to(request, run_url)
        form = action.form_class(posted, run=run, step=step, cut=cut)
    else:
        form = action.form_class(posted, run=run)
    if request.method == "POST":
        if moved_on := form.moved_on():
            model_admin.message_user(
                request, f"Run {run.pk} moved on: {moved_on}; nothing was changed.", messages.WARNING
            )
            return _back_to(request, run_url)
        if run.status not in action.allowed_from:
            model_admin.message_user(request, f"{_refused(action, run)} Nothing was changed.", messages.ERROR)
            return _back_to(request, run_url)
        if form.is_valid():
            try:
                change = _perform(request, model_admin, action, run, form.cleaned_data["seen_status"], form)
            except history.AlreadyForked as exc:  # the confirmation was posted twice: show the fork
                model_admin.message_user(request, str(exc), messages.WARNING)
                return _back_to(request, model_admin.page_url(request, "run", exc.fork_id))
            except RefusedByDatabase as exc:  # what was typed in: shown next to it, as form errors are
                form.add_error(action.value_field, str(exc))
            except EverystepError as exc:
                model_admin.message_user(request, str(exc), messages.WARNING)
                return _back_to(request, run_url)
            else:
                model_admin.message_user(request, f"Run {run.pk}: {change}", messages.SUCCESS)
                if action.after is not None:
                    return _back_to(request, action.after(request, model_admin, run, form))
                return _back_to(request, run_url)
    url_args = (run.pk, step.pk) if step is not None else (run.pk,)
    context = {
        "action": action,
        "run": run,
        "form": form,
        "step": step,
        "cut": cut,
        "allowed": run.status in action.allowed_from,
        "refusal": _refused(action, run),
        "action_url": model_admin.page_url(request, f"run_{action.name}", *url_args),
        "action_form_template": model_admin.action_form_template,
        "discarded": getattr(form, "discarded", []),  # Retry's rows, as its form carries them
        "waiting_for": views.waiting_for(request, model_admin, run) if action.name in WAIT_ACTIONS else [],
        **views.page_context(request, model_admin, run),
    }
    return views.page_or_fragment(
        request, model_admin, context,
        fragment=model_admin.action_form_template,
        page=model_admin.action_template,
        title=(
            f"{action.label}: step {step.step_id} of run {run.pk}" if step else f"{action.label} run {run.pk}"
        ),
        opts=Workflow._meta,
    )


def _run_gone(request, model_admin, run_id, step_pk):
    """A confirmation posted for a run deleted since it was shown: say so and go
    to the run list (htmx swaps no 404: its Confirm button would do nothing)."""
    run_pk = views.parse_id(uuid.UUID, run_id)  # a malformed id is still a 404
    if step_pk is not None:
        views.parse_id(int, step_pk)
    model_admin.message_user(request, _gone(run_pk), messages.WARNING)
    return _back_to(request, model_admin.page_url(request, "changelist"))


def _gone(run_id) -> str:
    return f"Run {run_id} no longer exists; nothing was changed."


def _perform(request, model_admin, action, run, seen, form=None) -> str:
    """Take ``action`` on ``run`` and log it on the run's history; returns the
    change. Raises ``EverystepError`` when the operation refused (nothing written)."""
    change = action.perform(request, run, seen, form)
    model_admin.log_change(request, run, change)
    return change


def _refused(action, run) -> str:
    allowed = " or ".join(action.allowed_from)
    return f"Run {run.pk} is {run.status}: only a {allowed} run can be {action.done}."


def _back_to(request, url):
    # htmx would swap a redirect's target into the panel: make the browser navigate instead.
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


# ---------------------------------------------------------------- bulk (the run list)


@admin.action(permissions=["retry"], description="Retry selected runs")
def retry_selected(model_admin, request, queryset):
    return bulk_action(model_admin, request, queryset, ACTIONS["retry"])


@admin.action(permissions=["stop"], description="Stop selected runs")
def stop_selected(model_admin, request, queryset):
    return bulk_action(model_admin, request, queryset, ACTIONS["stop"])


def bulk_action(model_admin, request, queryset, action: RunAction):
    """The confirmation page, then (on its POST) the action on each run it listed.

    The page records each run's status as seen; a run that moved on since is
    left alone and named in a message."""
    if not may(request, model_admin, action):
        raise PermissionDenied
    limit = model_admin.bulk_action_limit
    too_many = f"Select at most {limit} runs for one {action.label.lower()}; nothing was changed."

    if request.POST.get("post"):
        seen = {
            views.parse_id(uuid.UUID, key[len("seen-") :]): value
            for key, value in request.POST.items()
            if key.startswith("seen-")
        }
        if len(seen) > limit:
            model_admin.message_user(request, too_many, messages.ERROR)
            return None
        # Retry's page also names each run's rows it listed, as its own confirmation does.
        marks = {
            views.parse_id(uuid.UUID, key[len("mark-") :]): value
            for key, value in request.POST.items()
            if key.startswith("mark-")
        }
        # Each run the confirmation offered, by id: ``queryset`` holds only those
        # still matching the list's filters, and one that moved out of them
        # (a retried run on a status=failed list) must be reported, not dropped.
        runs = model_admin.get_queryset(request).filter(pk__in=seen).only("id", "name", "status")
        done, refusals, found = 0, [], set()
        for run in runs:
            found.add(run.pk)
            form = None
            if run.pk in marks:
                form = action.form_class({"seen_status": seen[run.pk], "seen_mark": marks[run.pk]}, run=run)
                form = form if form.is_valid() else None
            try:
                _perform(request, model_admin, action, run, seen[run.pk], form)
                done += 1
            except EverystepError as exc:
                refusals.append(str(exc))
        refusals += [_gone(run_id) for run_id in seen if run_id not in found]
        if done:
            model_admin.message_user(
                request, f"{action.done.capitalize()} {done} run{'s' if done > 1 else ''}.", messages.SUCCESS
            )
        for refusal in refusals[:BULK_REFUSALS_SHOWN]:
            model_admin.message_user(request, refusal, messages.WARNING)
        if len(refusals) > BULK_REFUSALS_SHOWN:
            model_admin.message_user(
                request,
                f"{len(refusals) - BULK_REFUSALS_SHOWN} more runs had moved on and were left alone.",
                messages.WARNING,
            )
        if not done and not refusals:
            model_admin.message_user(request, f"No run was {action.done}.", messages.WARNING)
        return None  # back to the run list

    runs = list(queryset.only("id", "name", "status", "claimed_by")[: limit + 1])
    if len(runs) > limit:
        model_admin.message_user(request, too_many, messages.ERROR)
        return None
    items = []
    for run in runs:
        actionable = run.status in action.allowed_from
        discarded = operations.retry_preview(run.pk) if actionable and action.name == "retry" else None
        items.append(
            {
                "run": run,
                "short_id": display.short_id(run.pk),
                "url": model_admin.page_url(request, "run", run.pk),
                "actionable": actionable,
                "discarded": discarded or [],
                "mark": operations.retry_mark(discarded, run.completed_at) if discarded is not None else "",
            }
        )
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"{action.label} selected runs",
        "subtitle": None,
        "action": action,
        "action_function": f"{action.name}_selected",
        "items": items,
        "actionable_count": sum(item["actionable"] for item in items),
        "opts": Workflow._meta,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "changelist_url": model_admin.page_url(request, "changelist"),
        "media": model_admin.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, model_admin.bulk_action_template, context)
