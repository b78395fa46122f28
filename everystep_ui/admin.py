"""Runs in the Django admin, read-only.

Engine state never changes through an admin form: every field is read-only and
nobody has add/change/delete permission here. Operator actions (retry, stop,
resolve, requeue; re-run and fork from a step) go through
``everystep.operations`` and ``everystep.history`` (see ``actions``), each
behind its own permission (``Workflow.Meta.permissions``).

Steps have no admin list of their own: a step is read on its run's page, behind
``view_workflow`` like every page. A list of all steps of all runs would show
the same payloads behind another permission (``view_step``), and answer no
question the run pages do not answer better (there is no step outside its run).
"""

import functools
import uuid

from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import Count, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.shortcuts import redirect
from django.urls import path, reverse
from django.utils.decorators import method_decorator
from django.utils.html import format_html
from django.utils.translation import gettext

from everystep.models import Step, Workflow

from . import display, overview, views
from .actions import ACTIONS, available, available_from_step, retry_selected, run_action, stop_selected
from .filters import RunFilterSetListFilter
from .paginators import EstimatedCountPaginator


class ReadOnlyAdmin(admin.ModelAdmin):
    paginator = EstimatedCountPaginator
    show_full_result_count = False  # spares a second COUNT(*) per page
    show_facets = admin.ShowFacets.NEVER  # facets count every filter choice
    list_display_links = None
    empty_value_display = "—"
    ordering = ["-id"]  # both tables' ids follow insertion order

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Workflow)
class WorkflowAdmin(ReadOnlyAdmin):
    run_template = "everystep_ui/run_detail.html"
    run_live_template = "everystep_ui/includes/run_live.html"
    step_template = "everystep_ui/step_detail.html"
    step_payloads_template = "everystep_ui/includes/step_payloads.html"
    action_template = "everystep_ui/run_action.html"
    action_form_template = "everystep_ui/includes/run_action.html"
    bulk_action_template = "everystep_ui/admin/bulk_action_confirmation.html"
    overview_template = "everystep_ui/overview.html"
    overview_live_template = "everystep_ui/includes/overview_live.html"
    change_list_template = "everystep_ui/admin/change_list.html"

    actions = [retry_selected, stop_selected]
    bulk_action_limit = 200  # runs per bulk action: each is previewed, changed and logged one by one

    list_display = [
        "short_id",
        "workflow",
        "status_badge",
        "claimer",
        "created",
        "completed",
        "duration",
        "steps_recorded",
    ]
    list_filter = [RunFilterSetListFilter]
    search_fields = ["name"]  # shows the search box; get_search_results decides
    search_help_text = "A run id or its first digits, part of a workflow name, or an idempotency key."
    sortable_by = ["short_id", "created"]  # indexed columns only

    class Media:
        css = {"all": ["everystep_ui/everystep_ui.css"]}

    def __init__(self, model, admin_site, *, url_name_prefix=None):
        super().__init__(model, admin_site)
        # "admin:everystep_workflow_" in the admin, "everystep_ui:" when mounted by urls.py.
        self.url_name_prefix = url_name_prefix or f"admin:{self.opts.app_label}_{self.opts.model_name}_"

    def get_queryset(self, request):
        # A correlated subquery counts the steps of the rows on the page only;
        # Count("steps") would join and GROUP BY, which may aggregate the whole
        # table before the page is cut.
        step_count = (
            Step.objects.filter(workflow=OuterRef("pk"))
            .order_by()
            .values("workflow")
            .annotate(n=Count("pk"))
            .values("n")
        )
        return (
            super()
            .get_queryset(request)
            .defer(*views.RUN_PAYLOADS)
            .annotate(step_count=Coalesce(Subquery(step_count), 0))
        )

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        # Keys compare exactly, spaces and all ("order-7 " is not "order-7").
        matches = Q(name__icontains=term) | Q(idempotency_key=search_term)
        id_range = id_prefix_range(term)
        if id_range:
            matches |= Q(pk__range=id_range)
        return queryset.filter(matches), False

    # Permissions of the operator actions (superusers have them all)

    def has_retry_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.retry_workflow")

    def has_stop_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.stop_workflow")

    def has_resolve_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.resolve_workflow")

    def has_requeue_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.requeue_workflow")

    def has_rerun_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.rerun_workflow")

    def has_fork_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.fork_workflow")

    def has_wake_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.wake_workflow")

    def has_send_event_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.send_event_workflow")

    def action_buttons(self, request, run):
        return available(request, self, run)

    def step_action_buttons(self, request, run, step_pk=None):
        """Re-run from here, Fork from here: for one step (``step_pk``), or which are offered."""
        return available_from_step(request, self, run, step_pk)

    # Pages

    @method_decorator(views.reading_replica)
    def changelist_view(self, request, extra_context=None):
        # Django drops a bulk action the user may not take and shows the list
        # again; refuse it outright, as the run page's actions do.
        action = request.POST.get("action") if request.method == "POST" else None
        ours = {func.__name__ for func in self.actions}
        if action in ours and action not in self.get_actions(request):
            raise PermissionDenied
        # Django's response_action filters pk__in on the posted ids, and one
        # that is not a UUID raises ValidationError there: a 500. The list and
        # the confirmation page only post run ids, so a malformed one is a
        # tampered request: 404, as for a malformed id in a URL (rather than
        # dropping it and acting on the rest of a selection nobody made).
        if request.method == "POST":
            for run_id in request.POST.getlist(ACTION_CHECKBOX_NAME):
                views.parse_id(uuid.UUID, run_id)
        extra_context = {"overview_url": self.page_url(request, "overview"), **(extra_context or {})}
        return super().changelist_view(request, extra_context)

    @method_decorator(views.reading_replica)
    def history_view(self, request, object_id, extra_context=None):
        # The run page links here: a page of the UI, read as the others are.
        return super().history_view(request, object_id, extra_context)

    def get_urls(self):
        name_prefix = f"{self.opts.app_label}_{self.opts.model_name}_"
        return self.run_urls(name_prefix) + super().get_urls()

    def run_urls(self, name_prefix=""):
        def page(view):
            def bound(request, *args, **kwargs):
                return view(request, *args, model_admin=self, **kwargs)

            return views.staff_only(bound, self.admin_site)

        return [
            path("overview/", page(overview.overview), name=f"{name_prefix}overview"),
            path("<str:run_id>/run/", page(views.run_detail), name=f"{name_prefix}run"),
            path(
                "<str:run_id>/run/steps/<str:step_pk>/",
                page(views.step_detail),
                name=f"{name_prefix}run_step",
            ),
            path(
                "<str:run_id>/run/json/<str:name>/",
                page(views.payload_json),
                name=f"{name_prefix}run_json",
            ),
            path(
                "<str:run_id>/run/steps/<str:step_pk>/json/<str:name>/",
                page(views.payload_json),
                name=f"{name_prefix}run_step_json",
            ),
            *(
                path(
                    f"<str:run_id>/run/steps/<str:step_pk>/{name}/"
                    if action.per_step
                    else f"<str:run_id>/run/{name}/",
                    page(functools.partial(run_action, action_name=name)),
                    name=f"{name_prefix}run_{name}",
                )
                for name, action in ACTIONS.items()
            ),
        ]

    def standalone_urls(self):
        """The run list and pages outside the admin URL tree (``everystep_ui.urls``)."""
        changelist = views.staff_only(self.changelist_view, self.admin_site)
        return [path("", changelist, name="changelist"), *self.run_urls()]

    def page_url(self, request, name, *args):
        namespace = request.resolver_match.namespace if request.resolver_match else None
        return reverse(self.url_name_prefix + name, args=args, current_app=namespace)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The run page stands in for the (read-only) change form."""
        run_id = views.parse_id(uuid.UUID, object_id)
        return redirect(self.page_url(request, "run", run_id))

    # Columns

    def action_checkbox(self, run):
        # Django's own renders a form widget through the template engine, about
        # a quarter of the list's time for 100 rows: the same markup, written directly.
        label = format_html(gettext("Select this object for an action - {}"), str(run))
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            ACTION_CHECKBOX_NAME,
            run.pk,
            label,
        )

    @admin.display(description="id", ordering="id")
    def short_id(self, run):
        url = reverse(self.url_name_prefix + "run", args=[run.pk])
        return format_html(
            '<a href="{}" title="{}"><code>{}</code></a>', url, run.pk, display.short_id(run.pk)
        )

    # The columns are written to fit a laptop screen next to the filters: long
    # names may wrap at their dots (and a claimer at @), times at the space.

    @admin.display(description="workflow")
    def workflow(self, run):
        return display.wrappable(run.name)

    @admin.display(description="status")
    def status_badge(self, run):
        return format_html('<span class="es-badge es-status-{0}">{0}</span>', run.status)

    @admin.display(description="claimer")
    def claimer(self, run):
        return display.wrappable(run.claimed_by) if run.claimed_by else None

    @admin.display(description="created", ordering="created_at")
    def created(self, run):
        return display.timestamp(run.created_at)

    @admin.display(description="completed")
    def completed(self, run):
        return None if self.waiting(run) else display.timestamp(run.completed_at)

    @admin.display(description="duration")
    def duration(self, run):
        if self.waiting(run):
            return None
        return display.format_duration(run.completed_at - run.created_at)

    @staticmethod
    def waiting(run) -> bool:
        """Not completed: still to run or running, or blocked (its completed_at
        is when it began to wait for an operator; the run page shows it)."""
        return run.completed_at is None or run.status == Workflow.Status.BLOCKED

    @admin.display(description="steps")
    def steps_recorded(self, run):
        return run.step_count


def id_prefix_range(term: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """Ids starting with ``term`` as a range of the primary key, which its index serves."""
    digits = term.replace("-", "").lower()
    if not 0 < len(digits) <= 32 or any(c not in "0123456789abcdef" for c in digits):
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))
