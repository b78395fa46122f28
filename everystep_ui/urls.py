"""The run list and run pages outside the admin URL tree, behind the same staff
login and permissions: ``path("everystep/", include("everystep_ui.urls"))``."""

from django.contrib import admin

from everystep.models import Workflow

from .admin import WorkflowAdmin

app_name = "everystep_ui"

urlpatterns = WorkflowAdmin(Workflow, admin.site, url_name_prefix="everystep_ui:").standalone_urls()
