"""How the commands that act on runs by id take their ids and report
refusals (not a command: its name starts with _)."""

import contextlib
from collections.abc import Callable, Iterable

from django.core.management.base import BaseCommand, CommandError

from everystep import operations
from everystep.errors import EverystepError


@contextlib.contextmanager
def refusals_as_errors():
    """An operation's refusal (``EverystepError``) becomes the command's error:
    its message printed, without a traceback."""
    try:
        yield
    except EverystepError as exc:
        raise CommandError(str(exc)) from None


def for_each_run(command: BaseCommand, run_ids: Iterable[str], operation: Callable, done: str) -> None:
    """``operation(run_id)`` on each run, printing ``<done> <run id>`` for each.

    Every id is parsed before anything changes, so a malformed one refuses the
    whole command; a run named twice is acted on once. A run the operation
    refuses does not stop the others: the refusals are the command's error
    once every run has been tried."""
    with refusals_as_errors():
        parsed = dict.fromkeys(operations.parse_run_id(run_id) for run_id in run_ids)
    refused = []
    for run_id in parsed:
        try:
            operation(run_id)
        except EverystepError as exc:
            refused.append(str(exc))
        else:
            command.stdout.write(f"{done} {run_id}")
    if refused:
        raise CommandError("\n".join(refused))
