from django.core.management.base import BaseCommand

from everystep import history
from everystep.errors import EverystepError

from ._cuts import describe_cut, refusal


class Command(BaseCommand):
    help = (
        "Fork a run that has ended from one of its recorded steps: a new run of the same "
        "workflow with the same arguments, holding copies of the rows recorded before that "
        "step (and of parallel branches running alongside it), which runs the rest anew."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("step_id", help="the step's dotpath, e.g. 3 or fanout.0.1")
        parser.add_argument(
            "--yes-unsafe",
            action="store_true",
            help="confirm that unsafe-to-repeat steps not copied run again in the fork",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="show what would not be copied; change nothing"
        )

    def handle(self, *, run_id, step_id, yes_unsafe, dry_run, **options):
        try:
            if dry_run:
                cut = history.fork_preview(run_id, step_id)
            else:
                fork, cut = history.fork_from_step(run_id, step_id, confirm_unsafe=yes_unsafe)
        except EverystepError as exc:
            raise refusal(exc)
        left_out = "copied (they run anew in the fork)"
        self.stdout.write(describe_cut(cut, left_out, negated=True, dry_run=dry_run))
        if not dry_run:
            self.stdout.write(
                f"run {fork.id}: forked from run {cut.run_id} at step {step_id}; it is scheduled"
            )
