from django.apps import AppConfig


class EverystepConfig(AppConfig):
    name = "everystep"
    verbose_name = "everystep"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks  # noqa: F401  (registers the system checks)
