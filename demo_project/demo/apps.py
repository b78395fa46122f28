from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "demo_project.demo"
    label = "demo"
    verbose_name = "everystep demo"
