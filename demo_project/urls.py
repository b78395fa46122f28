from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/everystep/workflow/")),
    path("admin/", admin.site.urls),
    path("everystep/", include("everystep_ui.urls")),
]
