"""What everystep_rerun and everystep_fork print (not a command: its name starts with _)."""

from django.core.management.base import CommandError


def describe_cut(cut, participle: str, *, negated: bool = False, dry_run: bool) -> str:
    """The rows the cut leaves out ("3 step rows were <participle>"), then the
    rows kept alongside and the kept rows that block, one line each."""
    count = len(cut.discarded)
    if dry_run:
        verb = "would not be" if negated else "would be"
    else:
        verb = ("was" if count == 1 else "were") + (" not" if negated else "")
    lines = [f"run {cut.run_id} cut at step {cut.step.step_id}: {len(cut.kept)} step rows kept"]
    lines.append(f"{count} step row{'s' if count != 1 else ''} {verb} {participle}:")
    for row in cut.discarded:
        unsafe = f" [{row.unsafe}: its effect happens again]" if row.unsafe else ""
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
