"""A run's history cut at one of its steps: re-run the run from that step in
place (:func:`rerun_from_step`), or fork it from there into a new run
(:func:`fork_from_step`).

The rows *after* a step S, which a re-run discards and a fork does not copy:
S's own row, and every row recorded after it (a greater ``everystep_step.id``:
the recording order), except the rows of parallel branches running alongside
S's branch (the row and S lie in different branches of one ``parallel``
call). Such a branch never sees S's outcome, so its rows hold whatever S does
next. Every other row recorded after S may depend on S: a later step in S's
scope (also inside a fork nested there), or a step after the ``parallel``
call that holds S, which starts only once all its branches have ended.

A fork also leaves out a task run's ``task:started`` row (``everystep.tasks``:
the time the run first started, ``TaskResult.started_at``): the fork is a new
run, enqueued later, and records its own start. A re-run keeps it (unless cut
at it): the run in place keeps its first start.

Why replay resumes correctly from the rows kept: they are exactly what the run
would hold had its process died just before S's row was written, with S's
branch slower than its siblings. That is a state a crash can leave, and replay
resumes it as the uninterrupted run would go on (``docs/concepts.md``, "Replay
is equivalent to the first pass"): it serves the kept rows, runs S again and
everything after it. A kept ``started`` row (an unsafe step whose outcome was
never recorded) blocks the run there, as it would after a crash.

Invariants: each operation is one transaction on the locked run row, checking
under that lock that the run is as the caller saw it (its status and its
history: how many rows, and the last row's id); otherwise it raises
``EverystepError`` and writes nothing. A crash at any line leaves everything as
it was (the transaction rolls back) or the whole operation done.
"""

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import uuid6

from . import database, registry, waits
from .errors import EverystepError
from .models import RunFork, Step, Workflow
from .operations import _allowed_from, _check_mark, _refusal, mark_of, parse_run_id
from .scheduling import notify_scheduled
from .statements import uuid_param

Status = Workflow.Status

RERUNNABLE = (Status.FAILED, Status.STOPPED, Status.COMPLETED)
# A fork copies a settled history: the run has ended (blocked included).
FORKABLE = tuple(Status.terminal_values())
BATCH = 500  # ids per IN (...) list: well under every backend's limit on parameters
# The name of a task run's first step (everystep.tasks.STARTED_STEP_ID), which
# a fork leaves out; everystep.tasks is not imported here (Django 6 only).
TASK_START = "everystep.tasks.task_started"


@dataclass(frozen=True)
class CutRow:
    """A step row of a cut history: ``why`` it is discarded (or kept);
    ``unsafe``: ``registry.repeat_risk`` of its function (empty when it is
    safe to repeat)."""

    id: int
    step_id: str
    name: str
    status: str
    unsafe: str
    why: str

    @property
    def named(self) -> str:
        """The function's name, and why it may be unsafe when it is not marked so."""
        return f"{self.name}, {self.unsafe}" if self.unknown else self.name

    @property
    def unknown(self) -> bool:
        """Whether no step of this name can be found here (so it may be unsafe to repeat)."""
        return self.unsafe == registry.UNKNOWN


@dataclass(frozen=True)
class Cut:
    """A run's history cut at ``step``.

    ``discarded``: ``step`` and the rows after it, in recording order (a
    re-run deletes them, a fork does not copy them: they run anew); for a
    fork, also a task run's ``task:started`` row, before ``step``.
    ``alongside``: rows recorded after ``step`` in branches running alongside
    its own; they are kept. ``kept``: the ids of every row kept, in recording
    order. ``uncertain``: kept rows still ``started``, where the resumed run
    (or the fork) blocks until resolved. ``mark`` names the history the cut was
    made from: pass it back as ``expected_mark`` so that nothing is written if
    the history changed meanwhile.
    """

    run_id: uuid.UUID
    status: str
    step: CutRow
    discarded: tuple[CutRow, ...]
    alongside: tuple[CutRow, ...]
    uncertain: tuple[CutRow, ...]
    kept: tuple[int, ...]
    mark: str

    @property
    def unsafe(self) -> tuple[CutRow, ...]:
        """The discarded rows whose step is, or may be, unsafe to repeat (their
        effects happen again): the cut needs a confirmation."""
        return tuple(row for row in self.discarded if row.unsafe)


def rerun_preview(run_id, step_id: str) -> Cut:
    """What :func:`rerun_from_step` would discard and keep now; changes nothing.
    Refuses (``EverystepError``) a malformed or unknown run id, a run that
    cannot be re-run, and a step the run has not recorded."""
    return _preview(run_id, step_id, RERUNNABLE, "re-run from a step")


def fork_preview(run_id, step_id: str) -> Cut:
    """What :func:`fork_from_step` would copy and leave out now; changes nothing.
    Refuses as :func:`rerun_preview` does."""
    return _preview(run_id, step_id, FORKABLE, "forked", fork=True)


def _preview(run_id, step_id: str, allowed, done: str, *, fork: bool = False) -> Cut:
    run_id = parse_run_id(run_id)
    status = Workflow.objects.filter(id=run_id).values_list("status", flat=True).first()
    if status not in allowed:
        raise _refusal(run_id, None, allowed, done)
    return _cut(run_id, status, step_id, fork=fork)


def rerun_from_step(
    run_id,
    step_id: str,
    *,
    expected_status: str | None = None,
    expected_mark: str | None = None,
    confirm_unsafe: bool = False,
) -> Cut:
    """Re-run a ``failed``, ``stopped`` or ``completed`` run from ``step_id``, in place.

    Deletes the step's row and the rows after it (see the module), clears the
    run's result, error, end and claimer, and sets it ``scheduled``: its next
    replay serves the rows kept and runs the rest again. Refuses, writing
    nothing, when the run is not in ``expected_status`` (or any allowed
    status), its history is not ``expected_mark``, or a discarded step is
    unsafe to repeat and ``confirm_unsafe`` is not set. Returns the cut made.
    """
    run_id = parse_run_id(run_id)
    statuses = _allowed_from(run_id, expected_status, RERUNNABLE, "re-run from a step")
    with database.atomic():
        status = (
            Workflow.objects.select_for_update()
            .filter(id=run_id)
            .values_list("status", flat=True)
            .first()
        )
        if status not in statuses:
            raise _refusal(run_id, expected_status, RERUNNABLE, "re-run from a step")
        cut = _cut(run_id, status, step_id)
        _check_mark(run_id, expected_mark, cut.mark, "its recorded steps")
        _check_unsafe(cut, confirm_unsafe, "re-running")
        for ids in _batches([row.id for row in cut.discarded]):
            Step.objects.filter(workflow_id=run_id, id__in=ids).delete()
        Workflow.objects.filter(id=run_id, status=status).update(
            status=Status.SCHEDULED, error=None, result=None, completed_at=None, claimed_by=None
        )
        notify_scheduled()
    return cut


class AlreadyForked(EverystepError):
    """``fork_from_step`` was asked again for the fork it made as ``fork_id``
    (a confirmation sent twice): nothing more was made."""

    def __init__(self, run_id, fork_id):
        super().__init__(
            f"run {run_id} was already forked into run {fork_id} by this request; nothing was changed"
        )
        self.fork_id = fork_id


def fork_from_step(
    run_id,
    step_id: str,
    *,
    expected_status: str | None = None,
    expected_mark: str | None = None,
    confirm_unsafe: bool = False,
    fork_id=None,
) -> tuple[Workflow, Cut]:
    """A new ``scheduled`` run of the same workflow with the same arguments,
    whose history holds copies of the rows of ``run_id`` kept by cutting it at
    ``step_id`` (see the module): its replay serves them and runs the rest
    anew. The origin is not changed; a ``RunFork`` row links the two.

    Rows are copied as stored, in recording order: a ``started`` row stays
    ``started`` (never ``done``), so the fork blocks there as its origin
    would. The origin's idempotency key is not copied: it identifies the
    origin (and the unique constraint on it would refuse a second row).
    Refuses, writing nothing, as :func:`rerun_from_step` does; the origin must
    have ended (``completed``, ``failed``, ``stopped`` or ``blocked``).
    Returns the new run and the cut.

    ``fork_id``, the new run's id chosen by the caller, makes a request sent
    twice (an operator's confirmation posted again) make one fork: the second
    call raises :class:`AlreadyForked`, writing nothing.
    """
    run_id = parse_run_id(run_id)
    fork_id = uuid6.uuid7() if fork_id is None else parse_run_id(fork_id)
    statuses = _allowed_from(run_id, expected_status, FORKABLE, "forked")
    with database.atomic():
        origin = Workflow.objects.select_for_update().filter(id=run_id).only("name", "args", "status").first()
        # Under the origin's lock: a second request waits for the first one's fork.
        if Workflow.objects.filter(id=fork_id).exists():
            if RunFork.objects.filter(run_id=fork_id, origin_id=run_id).exists():
                raise AlreadyForked(run_id, fork_id)
            raise EverystepError(f"the fork's id {fork_id} is another run's; nothing was changed")
        if origin is None or origin.status not in statuses:
            raise _refusal(run_id, expected_status, FORKABLE, "forked")
        cut = _cut(run_id, origin.status, step_id, fork=True)
        _check_mark(run_id, expected_mark, cut.mark, "its recorded steps")
        _check_unsafe(cut, confirm_unsafe, "forking")
        fork = Workflow.objects.create(id=fork_id, name=origin.name, args=origin.args)
        _copy_rows(run_id, fork.id, cut)
        # By id: assigning the instance (run=fork) asks the project's routers
        # whether RunFork may point at a run on everystep's database.
        RunFork.objects.create(run_id=fork.id, origin_id=run_id, origin_step_id=cut.step.step_id)
        notify_scheduled()
    return fork, cut


# ---------------------------------------------------------------- the cut


def _cut(run_id, status: str, step_id: str, *, fork: bool = False) -> Cut:
    rows = list(
        Step.objects.filter(workflow_id=run_id)
        .order_by("id")
        .values_list("id", "step_id", "name", "status")
    )
    mark = mark_of(row[0] for row in rows)
    chosen = next((row for row in rows if row[1] == step_id), None)
    if chosen is None:
        raise EverystepError(
            f"run {run_id} has no recorded step {step_id!r} (recorded: {_some_ids(rows)}); "
            "nothing was changed"
        )
    at = step_id.split(".")
    unsafe = _unsafe_lookup()
    discarded, alongside, uncertain, kept = [], [], [], []
    for pk, sid, name, row_status in rows:
        if pk == chosen[0]:
            step = CutRow(pk, sid, name, row_status, unsafe(name), "the chosen step")
            discarded.append(step)
            continue
        if fork and name == TASK_START:
            # Copied, it would date the fork's start before the fork existed.
            why = "a task run's start: the fork records its own"
            discarded.append(CutRow(pk, sid, name, row_status, unsafe(name), why))
            continue
        if pk > chosen[0]:
            other = sid.split(".")
            i = _diverge(at, other)
            if i is None or i % 2 == 0:  # not in a branch running alongside: it may depend on the step
                discarded.append(CutRow(pk, sid, name, row_status, unsafe(name), _why_after(at, i)))
                continue
            why = f"branch {'.'.join(other[: i + 1])} runs alongside branch {'.'.join(at[: i + 1])}: kept"
            alongside.append(CutRow(pk, sid, name, row_status, unsafe(name), why))
        kept.append(pk)
        # A wait's started row is no uncertain effect: the run waits there again,
        # until the wake time or for the event it recorded.
        if row_status == Step.Status.STARTED and not waits.is_wait_step(name):
            why = "kept as started: its outcome was never recorded, so the run blocks there"
            uncertain.append(CutRow(pk, sid, name, row_status, unsafe(name), why))
    return Cut(
        run_id=run_id,
        status=status,
        step=step,
        discarded=tuple(discarded),
        alongside=tuple(alongside),
        uncertain=tuple(uncertain),
        kept=tuple(kept),
        mark=mark,
    )


def _diverge(a: list[str], b: list[str]) -> int | None:
    """The first position where two dotpaths differ (None if one extends the
    other). A dotpath alternates call ids (even positions) and branch indexes
    (odd positions): two step ids that part at a branch index lie in two
    branches of one ``parallel`` call, running alongside each other."""
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            return i
    return None


def _why_after(at: list[str], i: int | None) -> str:
    """Why a row recorded after the chosen step ``at``, parting from it at
    position ``i`` (a call id), depends on it."""
    if i is None:
        return "recorded after it"
    if i == len(at) - 1:
        scope = at[:-1]
        return f"later in branch {'.'.join(scope)}" if scope else "later in the workflow body"
    return f"after parallel {'.'.join(at[: i + 1])}, which holds the chosen step"


def _unsafe_lookup():
    """``unsafe(name)``: ``registry.repeat_risk``, asked once per function name."""
    seen: dict[str, str] = {}

    def unsafe(name: str) -> str:
        if name not in seen:
            seen[name] = registry.repeat_risk(name)
        return seen[name]

    return unsafe


def _some_ids(rows, limit: int = 10) -> str:
    ids = [row[1] for row in rows[:limit]]
    if not ids:
        return "none"
    return ", ".join(ids) + (f" and {len(rows) - limit} more" if len(rows) > limit else "")


def _check_unsafe(cut: Cut, confirmed: bool, doing: str) -> None:
    if cut.unsafe and not confirmed:
        names = ", ".join(f"{row.step_id} ({row.named})" for row in cut.unsafe)
        raise EverystepError(
            f"run {cut.run_id}: {doing} from step {cut.step.step_id} runs again "
            f"{len(cut.unsafe)} unsafe-to-repeat step{'s' if len(cut.unsafe) > 1 else ''} whose "
            f"effect already happened or may have: {names}. Nothing was changed; confirm that "
            "these effects may happen again to go ahead."
        )


# ---------------------------------------------------------------- copying rows

COPY_ROWS = (
    "INSERT INTO everystep_step (workflow_id, step_id, name, args, kwargs, status, result, error) "
    "SELECT %s, step_id, name, args, kwargs, status, result, error FROM everystep_step "
    "WHERE workflow_id = %s AND {} ORDER BY id"
)


def _copy_rows(origin_id, fork_id, cut: Cut) -> None:
    """Copy the kept rows into the fork, values as stored (no decoding: a
    megabyte result is not rebuilt in Python), in recording order: every row
    before the chosen step in one statement (but a task run's start, which
    the cut leaves out), then those alongside it."""
    conn = database.connection()
    ids = uuid_param(conn, fork_id), uuid_param(conn, origin_id)
    left_out = [row.id for row in cut.discarded if row.id < cut.step.id]
    before = "id < %s" + " AND id <> %s" * len(left_out)
    with conn.cursor() as cursor:
        cursor.execute(COPY_ROWS.format(before), [*ids, cut.step.id, *left_out])
        for batch in _batches([row.id for row in cut.alongside]):
            placeholders = ", ".join(["%s"] * len(batch))
            cursor.execute(COPY_ROWS.format(f"id IN ({placeholders})"), [*ids, *batch])


def _batches(ids: Sequence[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), BATCH):
        yield list(ids[start : start + BATCH])
