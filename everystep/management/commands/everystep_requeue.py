from django.core.management.base import BaseCommand, CommandError

from everystep import operations

from ._runs import for_each_run, refusals_as_errors


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
            with refusals_as_errors():
                ids = operations.requeue_claimer(claimer)
            for run_id in ids:
                self.stdout.write(f"requeued {run_id}")
            self.stdout.write(f"{len(ids)} run(s) of {claimer!r} requeued")
            return
        for_each_run(self, run_ids, operations.requeue_run, "requeued")
