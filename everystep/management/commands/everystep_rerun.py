from django.core.management.base import BaseCommand

from everystep import history
from everystep.errors import EverystepError

from ._cuts import describe_cut, refusal


class Command(BaseCommand):
    help = (
        "Re-run a failed, stopped or completed run from one of its recorded steps, in place: "
        "discard that step's row and the rows recorded after it (but those of parallel "
        "branches running alongside), and schedule the run again."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("step_id", help="the step's dotpath, e.g. 3 or fanout.0.1")
        parser.add_argument(
            "--yes-unsafe",
            action="store_true",
            help="confirm that discarded unsafe-to-repeat steps run again (their effects happen again)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="show what would be discarded; change nothing"
        )

    def handle(self, *, run_id, step_id, yes_unsafe, dry_run, **options):
        try:
            if dry_run:
                cut = history.rerun_preview(run_id, step_id)
            else:
                cut = history.rerun_from_step(run_id, step_id, confirm_unsafe=yes_unsafe)
        except EverystepError as exc:
            raise refusal(exc)
        self.stdout.write(describe_cut(cut, "discarded", dry_run=dry_run))
        if not dry_run:
            self.stdout.write(f"run {cut.run_id}: re-run from step {step_id}; it is scheduled again")
