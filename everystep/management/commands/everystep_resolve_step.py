from django.core.management.base import BaseCommand, CommandError

from everystep import operations, serde
from everystep.errors import EverystepError


class Command(BaseCommand):
    help = "Resolve the uncertain (started) step of a blocked run and put the run back to scheduled."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("step_id")
        choice = parser.add_mutually_exclusive_group(required=True)
        choice.add_argument("--result", metavar="JSON", help="record the step as done with this value")
        choice.add_argument("--error", metavar="MESSAGE", help="record the step as failed (StepFailure)")
        choice.add_argument("--discard", action="store_true", help="forget the step: it runs again")

    def handle(self, run_id, step_id, result, error, discard, **options):
        resolution = {"discard": discard, "error": error}
        if result is not None:
            try:
                resolution["result"] = serde.loads(result)
            except (ValueError, EverystepError) as exc:
                raise CommandError(f"--result is not valid JSON: {exc}")
        try:
            run = operations.resolve_step(run_id, step_id, **resolution)
        except EverystepError as exc:
            raise CommandError(str(exc))
        self.stdout.write(f"run {run.id}: step {step_id} resolved; the run is {run.status} again")
