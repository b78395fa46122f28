"""The test settings as a new project has them: no LOGGING, and an installed app
(``tests.worker``) whose ``workflows`` module the worker finds at start-up."""

from tests.settings import *  # noqa: F403

del LOGGING  # noqa: F821  (Django's default then: nothing configured for everystep)

INSTALLED_APPS = [*INSTALLED_APPS, "tests.worker"]  # noqa: F405
