import contextlib
import importlib.util
from pathlib import Path

from django.apps import AppConfig


class EverystepConfig(AppConfig):
    name = "everystep"
    verbose_name = "everystep"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.utils.autoreload import autoreload_started

        from . import checks  # noqa: F401  (registers the system checks)

        autoreload_started.connect(watch_failed_modules, dispatch_uid="everystep_watch_failed_modules")


def watch_failed_modules(sender, **kwargs):
    """runserver's reloader watches the modules in ``sys.modules``; a workflows
    module that failed to import is not there. Watch its file and the file that
    raised, so that saving the fix restarts the server."""
    from . import registry

    for failure in registry.autodiscover():
        sender.extra_files.add(Path(failure.file))
        with contextlib.suppress(ImportError, ValueError):  # its package went away meanwhile
            spec = importlib.util.find_spec(failure.module)
            if spec is not None and spec.origin:
                sender.extra_files.add(Path(spec.origin))
