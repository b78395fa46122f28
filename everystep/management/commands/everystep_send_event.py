from django.core.management.base import BaseCommand, CommandError

from everystep import serde, waits
from everystep.errors import EverystepError

from ._runs import refusals_as_errors


class Command(BaseCommand):
    help = (
        "Send the event KEY to a run (wait_for_event(KEY) returns its value). Idempotent per "
        "key: a second send of a key changes nothing."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id", metavar="RUN_ID")
        parser.add_argument("key", metavar="KEY")
        parser.add_argument(
            "--value", metavar="JSON", default="null",
            help="the event's value, as JSON (everystep's tagged values, such as dates, too)",
        )

    def handle(self, *, run_id, key, value, **options):
        try:
            decoded = serde.loads(value)  # as the UI's Send event form reads it: tagged values too
        except (ValueError, EverystepError) as exc:
            raise CommandError(f"--value is not valid JSON: {exc}") from None
        with refusals_as_errors():
            stored = waits.send_event(run_id, key, decoded)
        if stored:
            self.stdout.write(f"sent event {key!r} to {run_id}")
        else:
            self.stdout.write(f"run {run_id} already had event {key!r}; nothing was changed")
