import datetime as dt
import math

from django.core.management.base import BaseCommand, CommandError

from everystep import operations
from everystep.errors import EverystepError


class Command(BaseCommand):
    help = (
        "Delete terminal runs (and their steps) that ended more than --older-than days ago, "
        "in batches. Default statuses: completed, failed, stopped (blocked only when named)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--older-than", type=float, required=True, metavar="DAYS")
        parser.add_argument(
            "--status",
            action="append",
            dest="statuses",
            metavar="STATUS",
            help="a terminal status to prune; repeat for several",
        )
        parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")
        parser.add_argument(
            "--batch", type=int, default=500, metavar="N", help="runs per delete (default 500)"
        )

    def handle(self, *, older_than, statuses, dry_run, batch, **options):
        if older_than < 0:
            raise CommandError(f"--older-than must not be negative, got {older_than}")
        # argparse's float takes nan, inf and 1e9, which no timedelta or date holds.
        if not math.isfinite(older_than) or older_than > operations.PRUNE_MAX_DAYS:
            raise CommandError(
                f"--older-than must be a number of days up to {operations.PRUNE_MAX_DAYS} (100 years), "
                f"got {older_than:g}"
            )
        if not 1 <= batch <= operations.MAX_PRUNE_BATCH:
            raise CommandError(f"--batch must be 1 to {operations.MAX_PRUNE_BATCH:,}, got {batch}")
        try:
            count = operations.prune(
                older_than=dt.timedelta(days=older_than), statuses=statuses, batch=batch, dry_run=dry_run
            )
        except EverystepError as exc:
            raise CommandError(str(exc))
        verb = "would delete" if dry_run else "deleted"
        self.stdout.write(f"{verb} {count} run(s) that ended more than {older_than:g} day(s) ago")
