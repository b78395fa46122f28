from django.apps import AppConfig


class EverystepUIConfig(AppConfig):
    name = "everystep_ui"
    label = "everystep_ui"
    verbose_name = "everystep UI"
