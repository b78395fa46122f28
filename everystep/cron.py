"""Cron schedules: ``@workflow(cron="*/5 * * * *")``, and the starter the claim
loop asks to start their due slots.

A *slot* is a time the expression matches in the schedule's zone. Its run is
an ordinary run of the workflow: the one argument is the slot (an aware
datetime in the schedule's zone), the idempotency key ``cron:`` followed by
the slot in UTC (``cron:2026-03-01T09:00:00Z``). Nothing else is stored: the
runs are the record, and the latest ``cron:`` key of a workflow is its last
started slot.

Every worker tries to start every due slot. The unique ``(name,
idempotency_key)`` constraint lets one insert win and the others find its row
(``scheduling.insert_run_once``, in a savepoint), so a slot gets one run
however many workers race for it.

Catch-up: a worker starts, for each schedule, the most recent slot that is
due, never the ones before it: after downtime (no worker alive during several
slots), or when its loop was held up past a slot, the missed slots collapse
into one run, of the latest. A schedule that has never started a slot starts
at its next slot, so a new schedule does not fire for a slot before it existed.
Slots overlap freely: a slot starts even when the previous slot's run is
still running.

Invariants (what a crash at any line leaves behind): a slot's run is one
INSERT committed on its own; a crash before it leaves the slot without a run,
and the next check of any worker starts it (or a newer slot, if one is due by
then); a crash after it leaves an ordinary ``scheduled`` run.
"""

import datetime as dt
import functools
import inspect
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DatabaseError

from .errors import EverystepError

logger = logging.getLogger("everystep")

UTC = dt.UTC
KEY_PREFIX = "cron:"
_KEY_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
# The overview calls the latest slot missed once it is this old and has no run:
# a live worker starts a slot within milliseconds of its time.
MISSED_AFTER = dt.timedelta(seconds=30)
# Skipped slots are counted up to this many (a per-second schedule after days of downtime).
_COUNT_LIMIT = 10_000
_NEVER = dt.datetime.max.replace(tzinfo=UTC)
_MAX_BACKOFF = 5.0
# Bounds the work around a DST change where cronsim's iteration goes astray.
_TRIES = 1_000
# cronsim looks 50 years ahead for a slot; latest_at() as far back.
_LOOK_BACK = dt.timedelta(days=50 * 366)
_SECOND = dt.timedelta(seconds=1)  # slots fall on whole seconds


class ScheduleError(EverystepError):
    """A ``@workflow(cron=...)`` declaration that cannot run: a bad expression or
    time zone, one that never matches, or a workflow that cannot take the slot."""


@dataclass(frozen=True)
class CronSchedule:
    """A workflow's schedule: ``expression`` evaluated in the zone ``timezone``."""

    workflow: str
    expression: str
    timezone: str = "UTC"

    @functools.cached_property
    def zone(self) -> dt.tzinfo:
        # cronsim evaluates in the zone of the datetime it is given; plain UTC
        # (no DST handling to do) is datetime's own.
        return UTC if self.timezone == "UTC" else _zone(self.timezone)

    def next_after(self, moment: dt.datetime) -> dt.datetime | None:
        """The first slot strictly after ``moment``, in UTC; None if none comes
        within 50 years."""
        moment = moment.astimezone(UTC)
        slot = self._forward(moment)
        if slot is None or self.zone is UTC or self._on_wall_clock:
            return slot
        # Frequent slots follow real time: a UTC instant is a slot when the zone's
        # clock then reads a matching time. Where the clock changes off the hour
        # (Pacific/Chatham, Australia/Lord_Howe), cronsim's iteration in the zone
        # steps over such slots (a second pass's 02:45, the hour after a jump);
        # on a clock at the fixed offset in force, it cannot. So the earliest of
        # cronsim's slot and the fixed clock's, on each side of a change between.
        zone = self.zone
        before = moment.astimezone(zone).utcoffset()
        clocks = [(before, moment)]
        if slot.astimezone(zone).utcoffset() != before:
            # The last second before the change, then the clock after it.
            def unchanged(second: dt.datetime) -> bool:
                return second.astimezone(zone).utcoffset() == before

            last = _last_second(moment.replace(microsecond=0), slot, unchanged)
            clocks.append(((last + _SECOND).astimezone(zone).utcoffset(), max(moment, last)))
        for offset, start in clocks:
            found = self._on_fixed_clock(offset, start)
            if found is not None and moment < found < slot and found.astimezone(zone).utcoffset() == offset:
                slot = found
        return slot

    def latest_at(self, moment: dt.datetime) -> dt.datetime | None:
        """The last slot at or before ``moment``, in UTC: by definition the slot
        that next_after() answers from the latest second whose answer is not after
        ``moment``, so the two always agree. (cronsim's reverse iteration is not
        used: it never returns around some clock changes, e.g. Pacific/Chatham's.)"""
        moment = moment.astimezone(UTC)
        high = moment.replace(microsecond=0)  # slots fall on whole seconds: none after it is <= moment
        # Back in growing steps (a yearly schedule's latest slot is found in about
        # 25 of them), then bisect: a few dozen next_after() calls at most.
        back = _SECOND
        while (found := self.next_after(high - back)) is None or found > moment:
            if back > _LOOK_BACK:
                return None
            high, back = high - back, back * 4

        def not_after_moment(second: dt.datetime) -> bool:
            found = self.next_after(second)
            return found is not None and found <= moment

        return self.next_after(_last_second(high - back, high, not_after_moment))

    @functools.cached_property
    def _on_wall_clock(self) -> bool:
        """Whether cronsim reads the expression on the bare wall clock (a fixed
        time: the minute and hour fields specific, five fields), as Debian's cron
        does; frequent slots it follows in real time."""
        fields = self.expression.split()
        return len(fields) == 5 and not fields[0].startswith("*") and not fields[1].startswith("*")

    def _on_fixed_clock(self, offset: dt.timedelta, moment: dt.datetime) -> dt.datetime | None:
        """The first slot after ``moment`` on a clock that stays at ``offset``."""
        from cronsim import CronSim

        return _in_utc(next(CronSim(self.expression, moment.astimezone(dt.timezone(offset))), None))

    def _forward(self, moment: dt.datetime) -> dt.datetime | None:
        """The first slot cronsim's forward iteration yields after ``moment``."""
        from cronsim import CronSim

        start = moment
        for _ in range(_TRIES):
            previous = None
            for slot in itertools.islice(CronSim(self.expression, start.astimezone(self.zone)), _TRIES):
                slot = slot.astimezone(UTC)
                if slot > moment:
                    return slot
                # Not after ``moment``: in the second pass of a fall-back (02:10
                # CET), cronsim reads a fixed time on the bare wall clock and yields
                # the day's slot that ran in the first pass (02:30 CEST), then
                # tomorrow's. As next slot, it would make the loop sleep 0s until
                # 02:30 CET, with a query each turn. Skip it.
                if previous is not None and slot < previous:
                    break  # going back: cronsim is stuck in a fold off the hour (Chatham)
                previous = slot
            else:
                if previous is None:
                    return None  # no slot within 50 years
            start += dt.timedelta(minutes=1)  # afresh, from past the wall time it is stuck at
        return None

    def slots_between(self, after: dt.datetime, before: dt.datetime, limit: int = _COUNT_LIMIT) -> int:
        """How many slots fall strictly between ``after`` and ``before`` (at most ``limit``)."""
        from cronsim import CronSim

        count = 0
        for slot in CronSim(self.expression, after.astimezone(self.zone)):
            if count >= limit or _in_utc(slot) >= before:
                break
            count += 1
        return count

    def key(self, slot: dt.datetime) -> str:
        """The idempotency key of ``slot``'s run."""
        return KEY_PREFIX + slot.astimezone(UTC).strftime(_KEY_FORMAT)

    def argument(self, slot: dt.datetime) -> dt.datetime:
        """What the slot's run is called with: the slot in the schedule's zone."""
        return slot.astimezone(self.zone)

    def __str__(self) -> str:
        return f"{self.expression} ({self.timezone})"


def slot_of(key: str | None) -> dt.datetime | None:
    """The slot named by a run's idempotency key, or None for a key no schedule made."""
    if not key or not key.startswith(KEY_PREFIX):
        return None
    try:
        return dt.datetime.strptime(key[len(KEY_PREFIX) :], _KEY_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None


def _last_second(low: dt.datetime, high: dt.datetime, holds: Callable[[dt.datetime], bool]) -> dt.datetime:
    """The last whole second from ``low`` (where ``holds`` is true) to before
    ``high`` (where it is not) at which ``holds`` is still true, by bisection."""
    while high - low > _SECOND:
        middle = low + dt.timedelta(seconds=(high - low).total_seconds() // 2)
        low, high = (middle, high) if holds(middle) else (low, middle)
    return low


def _in_utc(slot: dt.datetime | None) -> dt.datetime | None:
    return None if slot is None else slot.astimezone(UTC)


def _zone(name: str) -> dt.tzinfo:
    from zoneinfo import ZoneInfo

    return ZoneInfo(name)


def declare(workflow: str, func: Callable, expression, timezone) -> CronSchedule:
    """The schedule of ``@workflow(cron=expression, timezone=timezone)``, or a
    :class:`ScheduleError` naming the workflow, the expression and the problem."""
    from cronsim import CronSimError

    where = f"workflow {workflow}: cron={expression!r}"
    if not isinstance(expression, str):
        raise ScheduleError(f"{where}: the expression must be a string like '*/5 * * * *'")
    if not isinstance(timezone, str) or not timezone:
        raise ScheduleError(f"{where}: timezone must be a zone name like 'Europe/Paris', got {timezone!r}")
    schedule = CronSchedule(workflow, " ".join(expression.split()), timezone)
    try:
        schedule.zone  # noqa: B018  (loads the zone: an unknown name raises here)
    except (KeyError, ValueError, OSError):  # ZoneInfoNotFoundError is a KeyError
        raise ScheduleError(
            f"{where}: unknown time zone {timezone!r}: give an IANA name like 'UTC' or "
            "'Europe/Paris' (on a system without a zone database, pip install tzdata)"
        ) from None
    try:
        first = schedule.next_after(dt.datetime.now(UTC))
    except CronSimError as exc:
        raise ScheduleError(
            f"{where}: not a valid cron expression ({exc}). Give five fields (minute hour "
            "day-of-month month day-of-week), or six with seconds first."
        ) from None
    if first is None:
        raise ScheduleError(f"{where}: the expression matches no time in the next 50 years")
    try:
        inspect.signature(func).bind(schedule.argument(first))
    except TypeError:
        raise ScheduleError(
            f"{where}: a scheduled workflow is called with one argument, the slot's time "
            f"(a datetime); its signature {inspect.signature(func)} does not take it"
        ) from None
    return schedule


def last_run(name: str):
    """The run of the workflow's latest started slot, or None. The unique
    ``(name, idempotency_key)`` index serves it: keys of one format sort as their slots."""
    from .models import Workflow

    return (
        Workflow.objects.filter(name=name, idempotency_key__startswith=KEY_PREFIX)
        .order_by("-idempotency_key")
        .only("id", "name", "idempotency_key", "status", "created_at", "completed_at")
        .first()
    )


@dataclass(frozen=True)
class ScheduleState:
    """What the overview (and the scrape-time metrics) show of a schedule at ``now``."""

    schedule: CronSchedule
    next_slot: dt.datetime | None
    latest_slot: dt.datetime | None  # the most recent slot at or before now
    last_run: object  # the Workflow row of the latest started slot, or None
    missed: bool  # the latest slot older than MISSED_AFTER is after the last started slot and has no run


def state(schedule: CronSchedule, now: dt.datetime) -> ScheduleState:
    from .models import Workflow

    last = last_run(schedule.workflow)
    overdue = schedule.latest_at(now - MISSED_AFTER)
    # Only a slot after the last started one can be missed: one before it either
    # ran or was skipped by a catch-up, and a new schedule's first run has no
    # slot before it that it owed (it starts at its next slot).
    missed = (
        last is not None
        and overdue is not None
        and overdue > slot_of(last.idempotency_key)
        and not Workflow.objects.filter(
            name=schedule.workflow, idempotency_key=schedule.key(overdue)
        ).exists()
    )
    return ScheduleState(schedule, schedule.next_after(now), schedule.latest_at(now), last, missed)


# ---------------------------------------------------------------- the starter


@dataclass
class _Entry:
    schedule: CronSchedule
    due: dt.datetime | None = None  # the next slot to start; None until this worker's first check


class CronStarter:
    """What a worker's claim loop asks between claims: :meth:`timeout` (how long
    it may sleep before a slot is due) and :meth:`start_due` (start what is due;
    no query while nothing is). ``now`` returns the current aware time (tests
    pass a clock of their own)."""

    def __init__(self, schedules, *, runner: str, now: Callable[[], dt.datetime] | None = None):
        self.runner = runner
        self._entries = [_Entry(schedule) for schedule in schedules]
        self._now = now or (lambda: dt.datetime.now(UTC))
        self._retry_at: dt.datetime | None = None
        self._backoff = 0.2

    def timeout(self, poll: float) -> float:
        """Seconds the loop may wait: ``poll``, or less when a slot is due sooner."""
        if not self._entries:
            return poll
        now = self._now()
        if self._retry_at is not None:
            due = self._retry_at
        elif any(entry.due is None for entry in self._entries):
            return 0.0
        else:
            due = min(entry.due for entry in self._entries)
        return max(0.0, min(poll, (due - now).total_seconds()))

    def start_due(self) -> int:
        """Start every schedule's latest slot that is due; returns how many runs
        this worker inserted. A database error is logged and retried later (with
        back-off), as is any other error: none reaches the loop."""
        from . import database

        now = self._now()
        if not self._entries or (self._retry_at is not None and now < self._retry_at):
            return 0
        inserted = 0
        try:
            for entry in self._entries:
                if entry.due is None:
                    inserted += self._first_check(entry, now)
                elif entry.due <= now:
                    inserted += self._start_latest(entry, now)
        except DatabaseError as exc:
            logger.warning(
                "worker %r: cannot start cron slots (%s); retrying in %.1fs", self.runner, exc, self._backoff
            )
            database.close_quietly()
            self._retry_at = now + dt.timedelta(seconds=self._backoff)
            self._backoff = min(self._backoff * 2, _MAX_BACKOFF)
            return inserted
        except Exception:
            # A bug here must not stop the worker from running runs: say it, try again later.
            logger.exception(
                "worker %r: error while starting cron slots; retrying in %.1fs", self.runner, self._backoff
            )
            self._retry_at = now + dt.timedelta(seconds=self._backoff)
            self._backoff = min(self._backoff * 2, _MAX_BACKOFF)
            return inserted
        self._retry_at, self._backoff = None, 0.2
        return inserted

    def _first_check(self, entry: _Entry, now: dt.datetime) -> int:
        """At start-up: catch up the latest slot if the schedule has run before
        and that slot has no run yet (one run, however many slots were missed)."""
        schedule = entry.schedule
        latest = schedule.latest_at(now)
        last = slot_of(getattr(last_run(schedule.workflow), "idempotency_key", None))
        inserted = 0
        logger.debug(
            "worker %r: cron %s first check: last slot started %s, latest slot %s",
            self.runner,
            schedule.workflow,
            last and schedule.key(last)[len(KEY_PREFIX) :],
            latest and schedule.key(latest)[len(KEY_PREFIX) :],
        )
        if latest is not None and last is not None and latest > last:
            inserted = self._start(schedule, latest, now, skipped=schedule.slots_between(last, latest))
        entry.due = schedule.next_after(now) or _NEVER
        return inserted

    def _start_latest(self, entry: _Entry, now: dt.datetime) -> int:
        """A slot came due: start the latest one (later than ``entry.due`` when the
        loop was held up past several slots; those before it are skipped)."""
        schedule = entry.schedule
        latest = schedule.latest_at(now)
        skipped = schedule.slots_between(entry.due - _SECOND, latest)
        inserted = self._start(schedule, latest, now, skipped=skipped)
        entry.due = schedule.next_after(now) or _NEVER
        return inserted

    def _start(self, schedule: CronSchedule, slot: dt.datetime, now: dt.datetime, *, skipped: int) -> int:
        from . import observability
        from .models import Workflow
        from .scheduling import insert_run_once

        key = schedule.key(slot)
        run, inserted = insert_run_once(Workflow, schedule.workflow, [schedule.argument(slot)], key)
        if not inserted:
            logger.debug(
                "worker %r: cron %s slot %s was started already, as run %s",
                self.runner,
                schedule.workflow,
                key[len(KEY_PREFIX) :],
                run.id,
            )
            return 0
        late = (now - slot).total_seconds()
        observability.cron_started(schedule.workflow, self.runner, late, skipped)
        logger.info(
            "cron %s %s: slot %s started as run %s%s%s",
            schedule.workflow,
            schedule,
            key[len(KEY_PREFIX) :],
            run.id,
            f", {late:.1f}s late" if late >= 1 else "",
            f"; {skipped} missed slot{'s' if skipped != 1 else ''} before it skipped" if skipped else "",
        )
        return 1
