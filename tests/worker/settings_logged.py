"""A project that sends everystep's INFO records to a handler of its own."""

from tests.worker.settings_unlogged import *  # noqa: F403

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"project": {"format": "project-log: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "project"}},
    "loggers": {"everystep": {"handlers": ["console"], "level": "INFO"}},
}
