"""Filters of the run list: a django-filter FilterSet, shown in the admin sidebar.

Every filter is an equality, a range or a containment test, never a
``SELECT DISTINCT`` over the table: workflow names come from the registry.
"""

import datetime as dt
import json
import sys

import django_filters
from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.views.main import ERROR_FLAG, PAGE_VAR
from django.utils import timezone

from everystep import registry, serde
from everystep.errors import EverystepError
from everystep.models import Workflow

from .json_contains import filter_containing


def workflow_name_choices() -> list[tuple[str, str]]:
    """Names of the workflows registered in this process."""
    names = getattr(registry, "workflow_names", None)
    return [(name, name) for name in (names() if names else [])]


class ArgumentJSONField(forms.CharField):
    """A JSON value to look for among a run's positional arguments.

    ``args`` is stored as a JSON list, so a dict or scalar is wrapped in a list:
    ``{"order_id": 42}`` matches a run with some argument holding that key.
    """

    default_error_messages = {
        "invalid_json": 'Enter valid JSON, for example {"order_id": 42} (%(problem)s).',
        "unstorable": "Enter a value a run's arguments can hold (%(problem)s).",
    }

    def to_python(self, value):
        text = super().to_python(value).strip()
        if not text:
            return None
        try:
            parsed = json.loads(text)
        except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
            raise forms.ValidationError(
                self.error_messages["invalid_json"],
                code="invalid_json",
                params={"problem": str(exc)},
            )
        # The JSON is read as the run page shows arguments, stored: a tag typed
        # ({"$es": "uuid", ...}) is the value it names, stored again as typed
        # (taken as a dict, it was stored wrapped and matched nothing).
        # json.loads takes NaN, Infinity and 1e400 (as inf), which no run's
        # arguments hold and the filtering would refuse with a 500; and text
        # with NUL or a lone surrogate, which PostgreSQL's jsonb refuses. The
        # engine's own check tells, so the list reports it as not applied.
        try:
            _refuse_unloaded_enums(parsed)
            value = serde.decode(parsed)
            serde.encode(value)
        except EverystepError as exc:
            raise forms.ValidationError(
                self.error_messages["unstorable"], code="unstorable", params={"problem": str(exc)}
            )
        return value if isinstance(value, list) else [value]


def _refuse_unloaded_enums(data) -> None:
    """An enum tag typed in a filter names a class already imported: decoding
    it imports its module otherwise, running module code for anyone who may
    view the list. Every stored enum's class is imported by the code that
    made it."""
    if isinstance(data, list):
        for item in data:
            _refuse_unloaded_enums(item)
    elif isinstance(data, dict):
        cls = data.get("cls") if data.get(serde.TAG) == "enum" else None
        if isinstance(cls, str) and _imported(cls) is None:
            raise EverystepError(f"the enum {data['cls']} is not one this process has imported")
        for item in data.values():
            _refuse_unloaded_enums(item)


def _imported(path: str):
    """What the dotted ``path`` names in a module imported already, or None."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        found = sys.modules.get(".".join(parts[:split]))
        if found is not None:
            for name in parts[split:]:
                found = getattr(found, name, None)
            return found
    return None


class ArgumentContainsFilter(django_filters.Filter):
    field_class = ArgumentJSONField

    def filter(self, qs, value):
        if value is None:
            return qs
        return filter_containing(qs, self.field_name, value)


def _start_of_day(day: dt.date) -> dt.datetime | None:
    """Midnight at the start of ``day`` in the current time zone, or None when
    that moment is outside the calendar in UTC, which SQLite and MySQL are
    sent (converting overflows): 0001-01-01 east of UTC. Every run was created
    after it, so the bound it would make leaves every run in."""
    moment = dt.datetime.combine(day, dt.time.min)
    if not settings.USE_TZ:
        return moment
    moment = timezone.make_aware(moment)
    try:
        moment.astimezone(dt.UTC)
    except OverflowError:
        return None
    return moment


class RunFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=Workflow.Status.choices, empty_label="any")
    name = django_filters.ChoiceFilter(label="Workflow", choices=workflow_name_choices, empty_label="any")
    # Not stripped: "worker-2 " is a worker of its own (the overview links to it).
    claimed_by = django_filters.CharFilter(label="Claimer", strip=False)
    # Day bounds become a range on created_at so the column's index serves them.
    created_after = django_filters.DateFilter(
        label="Created on or after",
        method="filter_created_after",
        widget=forms.DateInput(attrs={"type": "date"}),
    )
    created_before = django_filters.DateFilter(
        label="Created on or before",
        method="filter_created_before",
        widget=forms.DateInput(attrs={"type": "date"}),
    )
    has_idempotency_key = django_filters.BooleanFilter(
        label="Has idempotency key",
        field_name="idempotency_key",
        lookup_expr="isnull",
        exclude=True,
        widget=forms.Select(choices=[("", "any"), ("true", "yes"), ("false", "no")]),
    )
    args = ArgumentContainsFilter(
        label="Argument contains",
        help_text='JSON, e.g. {"order_id": 42}',
    )

    class Meta:
        model = Workflow
        fields = []

    # At the calendar's ends a day bound excludes no run: no bound is needed,
    # and computing one would overflow (a 500 for a date the input offers).

    def filter_created_after(self, queryset, name, value):
        start = _start_of_day(value)
        return queryset if start is None else queryset.filter(created_at__gte=start)

    def filter_created_before(self, queryset, name, value):
        end = _start_of_day(value + dt.timedelta(days=1)) if value < dt.date.max else None
        return queryset if end is None else queryset.filter(created_at__lt=end)


class RunFilterSetListFilter(admin.ListFilter):
    """Puts a FilterSet's form in the admin changelist sidebar and applies it."""

    title = "runs"
    template = "everystep_ui/admin/filterset.html"
    filterset_class = RunFilter

    def __init__(self, request, params, model, model_admin):
        super().__init__(request, params, model, model_admin)
        for name in self.expected_parameters():
            if name in params:
                # Taking the parameters out tells the changelist they are handled.
                self.used_parameters[name] = params.pop(name)[-1]
        self.filterset = self.filterset_class(
            self.used_parameters or None,
            queryset=model._default_manager.all(),
            request=request,
        )

    def expected_parameters(self):
        return list(self.filterset_class.base_filters)

    def has_output(self):
        return True

    def choices(self, changelist):
        """The other query parameters (search, ordering) the form must carry along."""
        for name, value in changelist.params.items():
            if name not in self.used_parameters and name not in (PAGE_VAR, ERROR_FLAG):
                yield {"name": name, "value": value}

    def queryset(self, request, queryset):
        """The valid filters applied; each invalid one reported and left out, so
        that the list is what it would be without it."""
        if not self.filterset.is_bound:
            return queryset
        form = self.filterset.form
        for name, errors in form.errors.items():
            label = form.fields[name].label if name in form.fields else "Filter"
            messages.error(request, f"The filter “{label}” was not applied: {' '.join(errors)}")
        # django-filter filters with the form's cleaned_data: the valid fields only.
        return self.filterset.filter_queryset(queryset)
