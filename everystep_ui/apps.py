from django.apps import AppConfig
from django.db.backends.signals import connection_created


class EverystepUIConfig(AppConfig):
    name = "everystep_ui"
    label = "everystep_ui"
    verbose_name = "everystep UI"

    def ready(self):
        from . import checks  # noqa: F401  (registers the system checks)
        from .json_contains import register_sqlite_function

        connection_created.connect(register_sqlite_function, dispatch_uid="everystep_ui_sqlite")
        # The workflow filter and the pending steps need the project's workflows
        # registered in the web process too, as workers do at start-up.
        from everystep.registry import autodiscover

        autodiscover()
