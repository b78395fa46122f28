from django.core.management.base import BaseCommand, CommandError

from everystep import operations
from everystep.errors import EverystepError


class Command(BaseCommand):
    help = (
        "Put runs parked by a crashed worker back to scheduled: the given runs, or every run "
        "left running under --claimer. A live claimer is fenced out."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_ids", nargs="*", metavar="RUN_ID")
        parser.add_argument("--claimer", metavar="NAME", help="requeue every run running under this worker")

    def handle(self, *, run_ids, claimer, **options):
        if bool(run_ids) == (claimer is not None):
            raise CommandError("give either RUN_ID... or --claimer NAME (exactly one of them)")
        if claimer is not None:
            try:
                ids = operations.requeue_claimer(claimer)
            except EverystepError as exc:
                raise CommandError(str(exc))
            for run_id in ids:
                self.stdout.write(f"requeued {run_id}")
            self.stdout.write(f"{len(ids)} run(s) of {claimer!r} requeued")
            return
        try:  # refuse a malformed id before changing anything
            parsed = [operations.parse_run_id(run_id) for run_id in run_ids]
        except EverystepError as exc:
            raise CommandError(str(exc))
        refused = []
        for run_id in parsed:
            try:
                operations.requeue_run(run_id)
            except EverystepError as exc:
                refused.append(str(exc))
            else:
                self.stdout.write(f"requeued {run_id}")
        if refused:
            raise CommandError("\n".join(refused))
