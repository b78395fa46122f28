"""The benchmark settings plus ``bench.cronapp``, whose schedule the workers start."""

from bench.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench.cronapp"]  # noqa: F405
