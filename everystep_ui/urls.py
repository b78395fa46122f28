"""The run list and run pages outside the admin URL tree, behind the same staff
login and permissions: ``path("everystep/", include("everystep_ui.urls"))``.

They are the pages of the ``WorkflowAdmin`` (or subclass) registered for
``Workflow`` on ``admin.site``, looked up when the project's URLconf is loaded
(after the admin's autodiscovery): its permissions, queryset and templates."""

from django.contrib import admin
from django.core.exceptions import ImproperlyConfigured

from everystep.models import Workflow

from .admin import WorkflowAdmin

app_name = "everystep_ui"


def mounted_admin() -> WorkflowAdmin:
    """An instance of the registered class (``WorkflowAdmin`` when none is)
    naming its URLs in this namespace."""
    admin_class = WorkflowAdmin
    if admin.site.is_registered(Workflow):
        admin_class = type(admin.site.get_model_admin(Workflow))
        if not issubclass(admin_class, WorkflowAdmin):
            raise ImproperlyConfigured(
                "everystep_ui.urls serves the pages of the admin registered for Workflow, and "
                f"{admin_class.__qualname__} is not a WorkflowAdmin: register a subclass of "
                "everystep_ui.admin.WorkflowAdmin, or do not include everystep_ui.urls."
            )
    return admin_class(Workflow, admin.site, url_name_prefix="everystep_ui:")


urlpatterns = mounted_admin().standalone_urls()
