from django.urls import path

from everystep.views import metrics_view

urlpatterns = [path("metrics", metrics_view)]
