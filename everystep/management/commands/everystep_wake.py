import functools

from django.core.management.base import BaseCommand

from everystep import operations

from ._runs import for_each_run


class Command(BaseCommand):
    help = (
        "Wake waiting runs at once: a sleep returns as at its wake time, an event wait with a "
        "timeout raises WaitTimeout as at its timeout (see docs/waits.md)."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_ids", nargs="+", metavar="RUN_ID")

    def handle(self, *, run_ids, **options):
        wake = functools.partial(operations.wake_now, actor="manage.py everystep_wake")
        for_each_run(self, run_ids, wake, "woke")
