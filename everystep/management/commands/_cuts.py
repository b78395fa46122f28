"""What everystep_rerun and everystep_fork print (not a command: its name starts with _)."""

from django.core.management.base import CommandError


def describe_cut(cut, what: str, *, dry_run: bool) -> str:
    """The rows the cut leaves out (``what`` says what happens to them), then
    the rows kept alongside and the kept rows that block, one line each."""
    verb = "would be" if dry_run else "were"
    lines = [f"run {cut.run_id} cut at step {cut.step.step_id}: {len(cut.kept)} step rows kept"]
    lines.append(f"{len(cut.discarded)} step row{'s' if len(cut.discarded) != 1 else ''} {verb} {what}:")
    for row in cut.discarded:
        unsafe = " [unsafe to repeat: its effect happens again]" if row.unsafe else ""
        lines.append(f"  {row.step_id}  {row.name}  ({row.status}; {row.why}){unsafe}")
    for row in cut.alongside:
        lines.append(f"  kept {row.step_id}  {row.name}  ({row.status}; {row.why})")
    for row in cut.uncertain:
        lines.append(f"  kept {row.step_id}  {row.name}  ({row.why})")
    return "\n".join(lines)


def refusal(exc: Exception) -> CommandError:
    """The operation's refusal as the command's error, naming the flag that confirms unsafe steps."""
    message = str(exc)
    if "confirm that these effects may happen again" in message:
        message += " (--yes-unsafe)"
    return CommandError(message)
