"""System checks of the UI's configuration (``everystep_ui.E0xx``)."""

from django.apps import apps
from django.conf import settings
from django.core import checks

from everystep import database

HTMX_MIDDLEWARE = "django_htmx.middleware.HtmxMiddleware"


@checks.register()
def check_htmx(app_configs, **kwargs):
    errors = []
    if not apps.is_installed("django_htmx"):
        errors.append(
            checks.Error(
                "everystep_ui needs django-htmx, which is not in INSTALLED_APPS.",
                hint='Add "django_htmx" to INSTALLED_APPS (it serves the vendored htmx script).',
                id="everystep_ui.E001",
            )
        )
    if HTMX_MIDDLEWARE not in settings.MIDDLEWARE:
        errors.append(
            checks.Error(
                f"everystep_ui needs {HTMX_MIDDLEWARE} in MIDDLEWARE.",
                hint=f'Add "{HTMX_MIDDLEWARE}" to MIDDLEWARE: the run pages read '
                "request.htmx to answer polls and expansions with partial pages.",
                id="everystep_ui.E002",
            )
        )
    return errors


@checks.register()
def check_read_database(app_configs, **kwargs):
    alias = getattr(settings, "EVERYSTEP_UI_READ_DATABASE", None)
    if alias is None or database.is_alias(alias):
        return []
    return [
        checks.Error(
            f"EVERYSTEP_UI_READ_DATABASE names {alias!r}, which is not an alias of DATABASES.",
            hint="Name the alias of a streaming replica of everystep's database, or remove the setting.",
            id="everystep_ui.E003",
        )
    ]
