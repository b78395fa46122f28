"""Django settings for building the documentation: enough to import everystep's
modules for the API reference. No database is configured (Django's dummy
backend), so the build never connects to one."""

SECRET_KEY = "everystep-docs-build"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "everystep",
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
