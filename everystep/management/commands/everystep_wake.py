from django.core.management.base import BaseCommand, CommandError

from everystep import operations
from everystep.errors import EverystepError


class Command(BaseCommand):
    help = (
        "Wake waiting runs at once: a sleep returns as at its wake time, an event wait with a "
        "timeout raises WaitTimeout as at its timeout (see docs/waits.md)."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_ids", nargs="+", metavar="RUN_ID")

    def handle(self, *, run_ids, **options):
        try:  # refuse a malformed id before changing anything
            parsed = [operations.parse_run_id(run_id) for run_id in run_ids]
        except EverystepError as exc:
            raise CommandError(str(exc))
        refused = []
        for run_id in parsed:
            try:
                operations.wake_now(run_id, actor="manage.py everystep_wake")
            except EverystepError as exc:
                refused.append(str(exc))
            else:
                self.stdout.write(f"woke {run_id}")
        if refused:
            raise CommandError("\n".join(refused))
