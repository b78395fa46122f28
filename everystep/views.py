"""``metrics_view``: the Prometheus endpoint a project mounts, e.g.
``path("metrics", metrics_view)``. Protect it as you would any internal
endpoint (network policy, or wrap the view in your own auth)."""

from django.http import HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from .observability import metrics  # None without everystep[metrics]


@require_safe
@never_cache
def metrics_view(request):
    """This process's everystep metrics plus gauges read from the database now.

    Mount it in ``urls.py`` (``path("metrics", metrics_view)``) and scrape it
    once for the queue gauges (``everystep_runs``,
    ``everystep_oldest_pending_run_age_seconds``). Answers ``GET`` and
    ``HEAD`` in the Prometheus text format, or OpenMetrics when the scraper
    asks for it; 501 with the install command without ``everystep[metrics]``.
    It has no authentication of its own: keep it on an internal network.
    """
    if metrics is None:
        return HttpResponse(
            "everystep metrics need prometheus-client: pip install 'everystep[metrics]'\n",
            status=501,
            content_type="text/plain; charset=utf-8",
        )
    body, content_type = metrics.exposition(request.headers.get("Accept", ""))
    return HttpResponse(body, content_type=content_type)
