"""Sentry reports (``everystep[sentry]``): one event per run that ends ``failed``.

everystep never initialises Sentry: it reports only when the project did
(a client is active). Stopped, blocked, drained, fenced and crashed runs are
not failures and are never reported; the runner only calls this after it
wrote ``failed``.
"""

import sentry_sdk


def report_failure(run, claimer: str, exc: BaseException) -> None:
    if not sentry_sdk.get_client().is_active():
        return
    # A forked scope: the context and tags belong to this event only.
    with sentry_sdk.new_scope() as scope:
        scope.set_context(
            "everystep", {"workflow": run.name, "run_id": str(run.id), "runner": claimer}
        )
        scope.set_tag("everystep.workflow", run.name)
        scope.set_tag("everystep.run_id", str(run.id))
        scope.set_tag("everystep.runner", claimer)
        scope.capture_exception(exc)
