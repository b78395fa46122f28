"""The claim loop: claims ``scheduled`` runs and executes them on a thread pool.

Invariants (what a crash at any line leaves behind):
- a claim is one short transaction; a crash after it leaves the claimed runs
  ``running`` under this worker's name, and the next start under the same name
  re-claims them first (the name must be unique among live workers and stable
  across restarts);
- the worker never holds more than ``pool_size`` runs and claims nothing while full;
- at shutdown a run leaves at its next step boundary (requeued by the runner);
  after ``drain`` seconds whatever is still running under this name is
  requeued, so a clean shutdown leaves nothing claimed. A run's step still in
  flight then writes nothing (its insert is fenced on the claim).

Every ``EVERYSTEP_HEARTBEAT_INTERVAL`` seconds the loop writes this worker's
heartbeat (``everystep.heartbeats``: who it is, its runs in flight and the
steps executing now), and requeues the runs of any worker whose heartbeat is
older than ``EVERYSTEP_RECOVER_STALE_AFTER`` (a guarded transition, re-checked
under a lock on that heartbeat). After losing the database itself, a worker
waits that long again before judging others, who lost it too.

On PostgreSQL a dedicated connection LISTENs for new runs (instant pickup) and
for operator stops/requeues (the run leaves at its next step boundary without
a query per step). Polling every ``poll`` seconds stays the fallback, and is
the only path on MariaDB/MySQL and SQLite. That connection uses the settings
of ``EVERYSTEP_LISTEN_DATABASE`` (a direct connection when everystep's
database is reached through PgBouncer in transaction mode); it first checks
that it hears a NOTIFY sent through everystep's database, and if it does not,
the worker warns and polls only.
"""

import concurrent.futures
import contextlib
import logging
import math
import os
import select
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.utils import timezone

from . import (
    children,
    claims,
    cron,
    database,
    heartbeats,
    observability,
    operations,
    registry,
    runner,
    serde,
    waits,
)
from .errors import DrainOrphan, EverystepError, Fenced, WorkflowImportError
from .models import Workflow
from .scheduling import CONTROL_CHANNEL, NOTIFY_CHANNEL

logger = logging.getLogger("everystep")

Status = Workflow.Status
_CONNECTION_ERRORS = (OperationalError, InterfaceError)
_MAX_BACKOFF = 5.0
# The listener's check that it hears NOTIFYs: a channel of its own (no worker
# wakes for it), and how long to wait for its own probe (milliseconds on a
# direct connection; the wait is the listener's alone, the loop polls meanwhile).
PROBE_CHANNEL = "everystep_probe"
PROBE_TIMEOUT = 5.0


MAX_POLL = 86400  # seconds: the longest poll interval a worker accepts
# The largest --pool: a thread and a database connection each, far beyond
# what one process uses well; a typo past it would be a worker whose heartbeat
# never fits pool_size (a 4-byte integer) and whose shutdown never ends.
MAX_POOL = 1000
# Seconds a control notice for a run with no slot here is kept: a claimed
# run's slot is seated within moments of its claim.
EARLY_NOTICE_KEPT = 5.0


class _Waker:
    """Wakes the claim loop. ``wake()`` is a socket write, safe from a signal
    handler (a ``threading.Event`` takes a lock the interrupted thread may hold)."""

    def __init__(self):
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # the buffer is full (already awake) or closed
            self._write.send(b"\0")

    def wait(self, timeout: float) -> None:
        ready, _, _ = select.select([self._read], [], [], timeout)
        if ready:
            with contextlib.suppress(OSError):  # drained: recv would block
                while self._read.recv(4096):
                    pass

    def close(self) -> None:
        self._read.close()
        self._write.close()


class _Slot:
    """One run in flight. ``left`` is set by the control channel when an
    operator stopped or requeued the run; the runner asks ``leave_check``
    at every step boundary, so it must stay in memory."""

    def __init__(self, worker: "Worker", run: Workflow):
        self.worker = worker
        self.run = run
        self.left = False
        self.state = None  # the run's RunState, once its body starts (runner's watch)

    def watch(self, state) -> None:
        self.state = state

    def executing(self) -> list[str]:
        """The ids of the run's steps executing now, for the heartbeat."""
        if self.state is None:
            return []
        return self.state.executing_steps()[: heartbeats.MAX_STEPS_PER_RUN]

    def leave_check(self):
        if self.left:
            return Fenced(
                f"run {self.run.id} was stopped or requeued while worker "
                f"{self.worker.name!r} ran it; it starts no further step here"
            )
        if self.worker.draining:
            return DrainOrphan(f"worker {self.worker.name!r} is shutting down; run {self.run.id} is requeued")
        return None


class Worker:
    """Claims runs and executes them until :meth:`stop` (or SIGTERM/SIGINT).

    ``manage.py everystep_worker`` maps its options onto these.
    ``pool_size``: runs executed at once. ``poll``: seconds between claims
    when idle. ``name``: who claims (default the hostname); it must be
    unique among live workers and stable across restarts of this worker.
    ``drain``: seconds to wait at shutdown for runs to reach a step boundary
    (0 waits forever). ``stop_when_idle``: return once nothing is scheduled and
    nothing is in flight (tests, batch jobs). ``install_signals``: handle
    SIGTERM/SIGINT, only when run on the main thread. ``listen``: use
    LISTEN/NOTIFY on PostgreSQL. ``metrics_port``, ``metrics_bind``: serve
    this worker's Prometheus metrics (needs ``everystep[metrics]``).
    ``heartbeat_interval`` and ``recover_stale_after`` default to the settings
    ``EVERYSTEP_HEARTBEAT_INTERVAL`` and ``EVERYSTEP_RECOVER_STALE_AFTER``.
    Bad values raise :class:`~everystep.errors.EverystepError`.
    """

    _DEFAULT = object()

    def __init__(
        self,
        *,
        pool_size: int = 4,
        poll: float = 0.2,
        name: str | None = None,
        drain: float = 30,
        install_signals: bool = True,
        stop_when_idle: bool = False,
        listen: bool = True,
        metrics_port: int | None = None,
        metrics_bind: str = "0.0.0.0",
        heartbeat_interval: float | None = None,
        recover_stale_after: float | None | object = _DEFAULT,
    ):
        if heartbeat_interval is None:
            heartbeat_interval = heartbeats.interval()
        if recover_stale_after is Worker._DEFAULT:
            recover_stale_after = heartbeats.stale_after()
        problems = heartbeats.problems(heartbeat_interval, recover_stale_after)
        if problems:
            raise EverystepError(" ".join(message for _, message in problems))
        if not 1 <= pool_size <= MAX_POOL:
            raise EverystepError(f"the pool size (--pool) must be 1 to {MAX_POOL:,}, got {pool_size}")
        # NaN passes the comparisons below: as a poll it makes every idle wait
        # 0 s (a busy loop), as a drain a deadline never reached.
        if not math.isfinite(poll):
            raise EverystepError(f"the poll interval must be a finite number of seconds, got {poll}")
        if poll <= 0:
            raise EverystepError(f"the poll interval must be positive, got {poll}")
        # Also the first back-off after a failed claim: a wait of some 300 years
        # would overflow select() and end the claim loop.
        if poll > MAX_POLL:
            raise EverystepError(
                f"the poll interval must be at most {MAX_POLL} seconds (a day), got {poll:g}"
            )
        if not math.isfinite(drain):
            raise EverystepError(
                f"the drain timeout must be a finite number of seconds (0 waits forever), got {drain}"
            )
        if drain < 0:
            raise EverystepError(f"the drain timeout must not be negative, got {drain}")
        name = name or socket.gethostname()
        if len(name) > 255:
            raise EverystepError(f"the worker name is {len(name)} characters; the limit is 255")
        serde.check_text("the worker name", name)  # written to claimed_by and the heartbeat
        self.pool_size = pool_size
        self.poll = poll
        self.name = name
        self.drain = drain
        self.install_signals = install_signals
        self.stop_when_idle = stop_when_idle
        self.listen = listen
        self.metrics_port = metrics_port
        self.metrics_bind = metrics_bind
        self.heartbeat_interval = heartbeat_interval
        self.recover_stale_after = recover_stale_after
        self.draining = False  # read by every leave_check: a plain bool, no lock
        self.abandoned = 0  # runs still executing a step when the drain timed out
        self._stopping = False
        self._forced = False
        self._waker: _Waker | None = None  # made by run()
        self._lock = threading.Lock()
        self._inflight: dict[uuid.UUID, _Slot] = {}
        # Control notices for runs with no slot here yet ({run id: when heard}):
        # one claimed here gets its slot a moment after the claim commits.
        self._early_notices: dict[uuid.UUID, float] = {}
        self._listener: threading.Thread | None = None
        self._listener_stop = threading.Event()
        self._metrics_server = None
        # This process, as its heartbeat reports it.
        self._identity = {
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "version": heartbeats.version(),
            "pool_size": pool_size,
        }
        self._next_beat = 0.0  # time.monotonic() of the next heartbeat
        self._next_recovery = 0.0  # ... and of the next look at the others' heartbeats
        # Judge others stale only from this time on (None: not before a heartbeat
        # of ours went through). Set a limit ahead after we lost the database.
        self._judge_from: float | None = 0.0
        self._cron: cron.CronStarter | None = None  # made by run(), from the registered schedules
        self._next_wake = 0.0  # time.monotonic() of the next look for due waiting runs

    # ------------------------------------------------------------ public

    def run(self) -> None:
        """Claim and execute runs until stopped, then drain and return.

        Refuses to start (``WorkflowImportError``) while a ``workflows`` module
        of an installed app fails to import: its runs could only fail."""
        failures = registry.autodiscover()
        if failures:
            raise WorkflowImportError(
                f"worker {self.name!r} cannot start: "
                + "; ".join(failure.summary() for failure in failures)
                + ". Fix it, then start the worker again.",
                failures,
            ) from failures[0].exception
        self._start_metrics()
        self._cron = cron.CronStarter(registry.schedules(), runner=self.name)
        self._waker = _Waker()
        previous = self._install_signal_handlers()
        engine_db = database.connection()
        if self.listen and engine_db.vendor == "postgresql":
            listen_db = connections[database.listen_alias()]
            self._listener = threading.Thread(
                target=self._listen,
                args=(listen_db.get_connection_params(), engine_db.get_connection_params()),
                name="everystep-listener",
                daemon=True,
            )
            self._listener.start()
        executor = ThreadPoolExecutor(self.pool_size, thread_name_prefix="everystep-run")
        self._identity["pid"] = os.getpid()  # made in one process, run in another (a fork)
        self._identity["started_at"] = timezone.now()
        logger.info("%s", self._started_line(engine_db))
        try:
            self._loop(executor)
        finally:
            self._shutdown(executor)
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _started_line(self, engine_db) -> str:
        """What a newcomer needs to know the worker is set up right: where it
        claims from, how it hears of new runs, and which workflows it can run."""
        pickup = "LISTEN on" if self._listener is not None else f"LISTEN off, polling every {self.poll:g}s"
        if self._listener is not None and database.listen_alias() != engine_db.alias:
            pickup += f" (through database {database.listen_alias()!r})"
        names = registry.workflow_names()
        if names:
            found = f"{len(names)} workflow{'s' if len(names) > 1 else ''}: {', '.join(names)}"
        else:
            found = "no workflows found in the installed apps' workflows modules"
        schedules = registry.schedules()
        if schedules:
            found += "; cron: " + ", ".join(f"{schedule.workflow} {schedule}" for schedule in schedules)
        limited = registry.concurrency_limits()
        if limited:
            found += "; at most running: " + ", ".join(f"{name} {n}" for name, n in sorted(limited.items()))
        return (
            f"worker {self.name!r} started: pool {self.pool_size}, {engine_db.display_name} "
            f"database {engine_db.alias!r}, {pickup}, {found}"
        )

    def stop(self) -> None:
        """Stop claiming and drain. A second call (or signal) cuts the drain short."""
        if self._stopping:
            self._forced = True
        self._stopping = True
        if self._waker is not None:
            self._waker.wake()

    # ------------------------------------------------------------ the loop

    def _loop(self, executor: ThreadPoolExecutor) -> None:
        recovered = False
        backoff = self.poll
        lost_at = None  # when claiming began to fail
        while not self._stopping:
            # Before the start-up reclaim: a restart under the name of a worker
            # gone stale then either keeps its runs or finds them requeued.
            due_in = self._tend(recover=True)
            # Before claiming, so that a slot's run can be claimed here at once;
            # also when full (another worker may have room). No query until a slot is due.
            self._cron.start_due()
            free = self.pool_size - len(self._inflight)
            claimed = []
            if free > 0:
                try:
                    if not recovered:
                        claimed = claims.reclaim_own(self.name, free)
                        recovered = True
                        if claimed:
                            logger.warning(
                                "worker %r: resuming %d run(s) left running under its name",
                                self.name,
                                len(claimed),
                            )
                        # At once: should the claim below fail, they would stay running
                        # under a live worker, which no recovery takes them from.
                        for run in claimed:
                            self._submit(executor, run)
                    # Not the runs just reclaimed either: requeued meanwhile, one would be claimed twice.
                    busy = [*self._in_flight(), *(run.id for run in claimed)]
                    fresh = claims.claim_runs(self.name, free - len(claimed), exclude=busy)
                    observability.claimed(self.name, len(fresh))
                    claimed += fresh
                    if claimed:
                        logger.debug(
                            "worker %r claimed %d run(s): %s",
                            self.name,
                            len(claimed),
                            ", ".join(f"{run.id} {run.name}" for run in claimed),
                        )
                    backoff = self.poll
                    if lost_at is not None:
                        self._reconnected("database", lost_at)
                        lost_at = None
                except DatabaseError as exc:
                    lost_at = lost_at or time.monotonic()
                    logger.warning("worker %r: cannot claim (%s); retrying in %.1fs", self.name, exc, backoff)
                    database.close_quietly()
                    self._waker.wait(backoff)
                    backoff = min(backoff * 2, _MAX_BACKOFF)
                    continue
                for run in fresh:
                    self._submit(executor, run)
            # After claiming, so that a NOTIFYed run is not held up by it; a run
            # woken here is claimed by the next turn, at once.
            wake_in, woken = self._wake_due()
            if woken:
                continue
            # Idle: a claim with free slots found nothing, and nothing is in flight.
            # (Not a turn that was full: its runs may have ended since the claim.)
            if self.stop_when_idle and free > 0 and not claimed and not self._inflight:
                return
            # Either full or the queue is empty for now: sleep until a free
            # slot, a NOTIFY, stop(), the poll interval, a heartbeat, the next cron
            # slot or the next wake time of a waiting run.
            self._waker.wait(max(0.0, min(self._cron.timeout(self.poll), due_in, wake_in)))

    def _wake_due(self) -> tuple[float, int]:
        """Wake the waiting runs whose time has come, when a look is due; returns
        the seconds until the next look (the next wake time, at most one poll
        interval away: a run suspended by another worker is seen by then) and
        how many runs it woke."""
        now = time.monotonic()
        if now < self._next_wake:
            return self._next_wake - now, 0
        self._next_wake = now + self.poll
        try:
            woken, upcoming = waits.wake_due()
        except DatabaseError as exc:
            logger.warning("worker %r: cannot wake due waiting runs (%s)", self.name, exc)
            database.close_quietly()
            return self.poll, 0
        if woken:
            logger.debug("worker %r woke %d waiting run(s)", self.name, woken)
            observability.woken(self.name, woken)
        if upcoming is not None:
            until = (upcoming - timezone.now()).total_seconds()
            self._next_wake = min(self._next_wake, now + max(0.0, until))
        return self._next_wake - time.monotonic(), woken

    # ------------------------------------------------------------ heartbeat and recovery

    def _tend(self, *, recover: bool) -> float:
        """Write the heartbeat and recover stale workers' runs, each when due;
        returns the seconds until one of them is due again. Database errors are
        logged: the claim loop has its own way through an outage."""
        now = time.monotonic()
        if now >= self._next_beat:
            self._next_beat = now + self.heartbeat_interval
            try:
                self._beat()
            except DatabaseError as exc:
                logger.warning("worker %r: cannot write its heartbeat (%s)", self.name, exc)
                database.close_quietly()
                self._judge_from = None
            else:
                if self._judge_from is None:
                    # The others lost the database too: give them time to write theirs.
                    self._judge_from = now + (self.recover_stale_after or 0)
                self._next_recovery = now  # look at the others after each beat
        can_recover = recover and self.recover_stale_after is not None and self._judge_from is not None
        if can_recover and now >= max(self._next_recovery, self._judge_from):
            self._recover_stale(now)
        # Only a look that can happen bounds the sleep: with recovery off, while
        # draining or before _judge_from, _next_recovery stays at the last beat
        # (only _recover_stale moves it on), and counting it would make every
        # wait 0 s: a busy loop with a claim query per turn.
        due = self._next_beat
        if can_recover:
            due = min(due, max(self._next_recovery, self._judge_from))
        return due - time.monotonic()

    def _beat(self) -> None:
        with self._lock:
            slots = list(self._inflight.values())
        heartbeats.beat(
            self.name,
            **self._identity,
            in_flight=len(slots),
            executing={str(slot.run.id): slot.executing() for slot in slots},
        )
        observability.heartbeat(self.name)

    def _recover_stale(self, now: float) -> None:
        """Requeue the runs of workers whose heartbeat is older than the limit, and
        plan the next look for when the next one would go stale."""
        limit = self.recover_stale_after
        self._next_recovery = now + self.heartbeat_interval
        try:
            others = heartbeats.others(self.name)
            for name, age, holds_runs in others:
                if age < limit:
                    self._next_recovery = min(self._next_recovery, now + limit - age)
                elif holds_runs:
                    self._recover_from(name, age)
        except DatabaseError as exc:
            logger.warning("worker %r: cannot look for stale workers (%s)", self.name, exc)
            database.close_quietly()

    def _recover_from(self, name: str, age: float) -> None:
        ids = operations.requeue_stale_worker(name, self.recover_stale_after)
        if not ids:
            return  # it came back meanwhile, or its runs moved on
        observability.recovered(self.name, len(ids))
        logger.warning(
            "worker %r: requeued %d run(s) of worker %r, silent for %.1fs "
            "(EVERYSTEP_RECOVER_STALE_AFTER = %ss): %s",
            self.name,
            len(ids),
            name,
            age,
            self.recover_stale_after,
            ", ".join(map(str, ids)),
        )

    # ------------------------------------------------------------ runs

    def _submit(self, executor: ThreadPoolExecutor, run: Workflow) -> None:
        slot = _Slot(self, run)
        with self._lock:
            self._seat(slot)
        observability.in_flight(self.name, 1)
        executor.submit(self._execute, slot)

    def _execute(self, slot: _Slot) -> None:
        """Execute the slot's run; then, while the worker runs on, claim the
        next run on this thread and execute it in the same slot. A busy queue
        then goes from one run to the next without the hand-off to the claim
        loop and back (two thread wake-ups and a loop turn per run)."""
        try:
            while slot is not None:
                # The next run's claim goes with this run's end where it can.
                next_claim = claims.NextClaim(self._to_pass_over)
                self._execute_run(slot, next_claim.finish)
                slot = self._take_next(slot, next_claim.runs)
        finally:
            if slot is not None:  # an exception went through: the slot is free all the same
                with self._lock:
                    self._inflight.pop(slot.run.id, None)
            observability.in_flight(self.name, -1)
            self._waker.wake()  # a slot is free

    def _execute_run(self, slot: _Slot, finish) -> None:
        run = slot.run
        began = time.monotonic()
        try:
            database.ready_for_run()
            status = runner.execute(
                run, self.name, leave_check=slot.leave_check, watch=slot.watch, finish=finish
            )
            if status == Status.WAITING:
                # Its wake time may come before the loop's next look, which it
                # computed before this wait existed: look again now.
                self._next_wake = 0.0
                self._waker.wake()
            if status is None:
                self._after_leaving(slot)
            else:
                self._log_end(run, status, time.monotonic() - began)
        except _CONNECTION_ERRORS as exc:
            # The database went away outside the body: the run is fine, put it back.
            logger.warning("run %s: database unavailable (%s); requeueing it", run.id, exc)
            database.close_quietly()
            if self._quietly(database.reconnecting, operations.release_run, run.id, self.name):
                observability.requeued(self.name, 1)
        except BaseException as exc:  # a KeyboardInterrupt from a step too: never leave the run running
            logger.exception("run %s: engine error outside the workflow body; failing the run", run.id)
            self._quietly(
                database.reconnecting,
                children.finisher(run),  # a child's end wakes its waiting parent
                run.id,
                self.name,
                Status.FAILED,
                error=serde.encode_exception(exc),
            )

    def _take_next(self, slot: _Slot, claimed: list[Workflow] | None) -> _Slot | None:
        """The slot's run has ended: claim one more run for the slot (unless
        ``claimed`` came with the run's end), unless the worker is stopping; the
        slot is handed over under the lock, so the claim loop never counts it
        free meanwhile (the worker holds at most ``pool_size`` runs). None:
        nothing to claim, the slot is free."""
        successor = None
        if self._stopping:  # no next run here: a run outliving the drain closes its own
            for run in claimed or ():  # claimed with the end, just before the stop
                if self._quietly(database.reconnecting, operations.release_run, run.id, self.name):
                    observability.requeued(self.name, 1)
            connections.close_all()  # this thread's connections only
        else:
            with contextlib.suppress(DatabaseError):  # at worst, the next run reconnects
                database.keep_for_next_run()
            runs = claimed
            if runs is None:
                try:
                    runs = claims.claim_runs(self.name, 1, exclude=self._in_flight())
                except DatabaseError:
                    runs = []  # the claim loop retries, and says so
                    database.close_quietly()
            observability.claimed(self.name, len(runs))
            if runs:
                successor = _Slot(self, runs[0])
                logger.debug("worker %r claimed run %s %s", self.name, runs[0].id, runs[0].name)
        with self._lock:
            self._inflight.pop(slot.run.id, None)
            if successor is not None:
                self._seat(successor)
        return successor

    def _seat(self, slot: _Slot) -> None:
        """Count ``slot`` in flight (under the lock), leaving at once if a stop
        or requeue of its run was heard between its claim and now."""
        self._inflight[slot.run.id] = slot
        heard = self._early_notices.pop(slot.run.id, None)
        # A notice older than that was about an earlier claim of the run (notices
        # are only pruned when a new one comes), not this one: this claim stays.
        if heard is not None and time.monotonic() - heard < EARLY_NOTICE_KEPT:
            slot.left = True

    def _in_flight(self) -> list:
        """The ids of the runs in flight here: a claim passes over them (one
        requeued while this worker still runs it must not run twice here)."""
        with self._lock:
            return list(self._inflight)

    def _to_pass_over(self) -> list | None:
        """For a claim sent with a run's end: :meth:`_in_flight`, or None once
        the worker is stopping (no claim then)."""
        return None if self._stopping else self._in_flight()

    def _log_end(self, run: Workflow, status: str, seconds: float) -> None:
        """One line per run that leaves this worker, as runserver logs a request."""
        if not logger.isEnabledFor(logging.INFO):
            return  # spares the error's query below
        if status == Status.SCHEDULED:
            logger.info("run %s %s requeued after %.2fs", run.id, run.name, seconds)
            return
        if status == Status.WAITING:
            logger.info("run %s %s waiting after %.2fs", run.id, run.name, seconds)
            return
        why, error = "", None
        if status != Status.COMPLETED:
            # A log line must never break the run's handling: without the reason, it still goes out.
            with contextlib.suppress(Exception):
                error = Workflow.objects.filter(id=run.id).values_list("error", flat=True).first()
            if isinstance(error, dict) and error.get("message") is not None:
                message = str(error["message"]).strip().splitlines() or [""]
                why = f": {error.get('type', 'error')}: {message[0]}"
        logger.info("run %s %s %s in %.2fs%s", run.id, run.name, status, seconds, why)

    def _after_leaving(self, slot: _Slot) -> None:
        """The run left without its end written: hand it back if a stale control
        notice made it leave, else say if it was deleted."""
        run = slot.run
        if slot.left:
            # The control NOTIFY may be about an earlier claim of the same run:
            # if the run is still ours, hand it back rather than park it.
            if operations.release_run(run.id, self.name):
                logger.info("run %s: control notice was stale; requeued it", run.id)
        elif not Workflow.objects.filter(id=run.id).exists():
            logger.warning("run %s was deleted while worker %r ran it; moving on", run.id, self.name)

    def _quietly(self, func, *args, **kwargs):
        try:
            return func(*args, **kwargs)
        except Exception:
            logger.exception("worker %r: could not record the end of a run; it stays claimed", self.name)

    # ------------------------------------------------------------ shutdown

    def _shutdown(self, executor: ThreadPoolExecutor) -> None:
        self._stopping = True
        self.draining = True  # every in-flight run leaves at its next step boundary
        if self._inflight:
            logger.info("worker %r: draining %d run(s)", self.name, len(self._inflight))
        deadline = time.monotonic() + self.drain if self.drain else None
        while self._inflight and not self._forced:
            if deadline is not None and time.monotonic() >= deadline:
                break
            due_in = self._tend(recover=False)  # alive while draining: keep our runs
            self._waker.wait(max(0.0, min(0.5, due_in)))  # woken as each run ends
        # Whatever is still claimed under this name (runs mid-step when the drain
        # timed out, or whose end could not be written) goes back to the queue.
        # Through an outage, only until the drain's deadline or a second signal:
        # the heartbeat left behind then goes stale, and another worker requeues them.
        def give_up() -> bool:
            return self._forced or (deadline is not None and time.monotonic() >= deadline)

        leftovers = []
        try:
            leftovers = database.reconnecting(operations.requeue_claimer, self.name, give_up=give_up)
        except Exception:
            logger.exception("worker %r: could not requeue its runs at shutdown", self.name)
        else:
            # Nothing is claimed under our name any more: we are gone, not stale.
            try:
                heartbeats.forget(self.name, hostname=self._identity["hostname"], pid=self._identity["pid"])
            except DatabaseError:
                logger.warning("worker %r: could not delete its heartbeat; it will show as stale", self.name)
        with self._lock:
            self.abandoned = len(self._inflight)
        observability.requeued(self.name, len(leftovers))
        if leftovers:
            logger.warning(
                "worker %r: requeued %d run(s) still claimed at shutdown (%d mid-step): %s",
                self.name,
                len(leftovers),
                self.abandoned,
                ", ".join(map(str, leftovers)),
            )
        if not self.abandoned:
            self._close_pool_connections(executor)
        executor.shutdown(wait=not self.abandoned, cancel_futures=True)
        self._listener_stop.set()
        if self._listener is not None:
            self._listener.join(timeout=2)
        self._waker.close()
        database.close_quietly()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        logger.info("worker %r stopped", self.name)

    def _close_pool_connections(self, executor: ThreadPoolExecutor) -> None:
        """Close the connections the pool threads kept between runs. A Django
        connection is closed by its own thread: one task per thread, each
        holding its thread at a barrier until every thread has one."""
        barrier = threading.Barrier(self.pool_size)

        def close() -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=5)
            connections.close_all()  # this thread's connections only

        closing = [executor.submit(close) for _ in range(self.pool_size)]
        concurrent.futures.wait(closing, timeout=10)  # before shutdown() cancels what has not started

    def _install_signal_handlers(self) -> dict:
        # Python delivers signals to the main thread only; an embedded worker
        # (run in a thread) is stopped by calling stop().
        if not self.install_signals or threading.current_thread() is not threading.main_thread():
            return {}
        return {signum: signal.signal(signum, self._on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}

    def _on_signal(self, signum, frame) -> None:
        # No logging here: the handler may interrupt the logging module holding its lock.
        self.stop()

    def _start_metrics(self) -> None:
        """Serve this worker's metrics (``--metrics-port``); record its pool size."""
        if self.metrics_port is not None:
            try:
                server, _ = observability.serve_worker_metrics(self.metrics_port, self.metrics_bind)
            except (OSError, ValueError) as exc:  # ValueError: a host IDNA cannot encode
                raise EverystepError(
                    f"cannot serve metrics on {self.metrics_bind}:{self.metrics_port}: {exc}"
                ) from None
            self._metrics_server = server
        observability.worker_started(self.name, self.pool_size)

    # ------------------------------------------------------------ LISTEN/NOTIFY (PostgreSQL)

    def _listen(self, params: dict, engine_params: dict) -> None:
        """LISTEN on a connection of its own (``EVERYSTEP_LISTEN_DATABASE``'s
        settings), after checking that it hears a NOTIFY sent the way
        ``schedule()`` sends one; if it does not, the worker polls only."""
        import psycopg

        backoff = self.poll
        lost_at = None  # when the LISTEN connection was lost
        while not self._listener_stop.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    for channel in (NOTIFY_CHANNEL, CONTROL_CHANNEL, PROBE_CHANNEL):
                        conn.execute(f"LISTEN {channel}")
                    if not self._hears_probe(conn, engine_params):
                        self._deaf()
                        return
                    conn.execute(f"UNLISTEN {PROBE_CHANNEL}")
                    backoff = self.poll
                    if lost_at is not None:
                        self._reconnected("LISTEN connection", lost_at)
                        lost_at = None
                    self._waker.wake()  # anything scheduled while we were not listening
                    while not self._listener_stop.is_set():
                        for notice in conn.notifies(timeout=min(self.poll, 1.0)):
                            self._on_notice(notice.channel, notice.payload)
            except Exception as exc:  # psycopg.Error mostly; the listener must not die
                if self._listener_stop.is_set():
                    return
                lost_at = lost_at or time.monotonic()
                logger.warning(
                    "worker %r: LISTEN connection lost (%s); polling until it is back", self.name, exc
                )
                self._listener_stop.wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)

    def _hears_probe(self, conn, engine_params: dict) -> bool:
        """Send a NOTIFY through a fresh connection to everystep's database, as
        ``schedule()`` would, and wait up to ``PROBE_TIMEOUT`` for ``conn`` to
        hear it. A pooler in transaction mode (PgBouncer) runs the LISTEN on a
        server connection it then gives to other clients: ``conn`` hears
        nothing. So does a LISTEN alias that names another database."""
        import psycopg

        token = f"{self.name}:{uuid.uuid4().hex}"
        # A bounded connect: a listener stuck here would neither listen nor warn.
        with psycopg.connect(**{"connect_timeout": 10, **engine_params}, autocommit=True) as sender:
            sender.execute("SELECT pg_notify(%s, %s)", [PROBE_CHANNEL, token])
        deadline = time.monotonic() + PROBE_TIMEOUT
        while not self._listener_stop.is_set() and (left := deadline - time.monotonic()) > 0:
            for notice in conn.notifies(timeout=min(left, 1.0)):
                if notice.channel != PROBE_CHANNEL:
                    self._on_notice(notice.channel, notice.payload)
                elif notice.payload == token:  # not another worker's probe
                    return True
        return self._listener_stop.is_set()  # stopping: no verdict to give

    def _deaf(self) -> None:
        if self._listener_stop.is_set():
            return
        logger.warning(
            "worker %r: its LISTEN connection (database alias %r) did not hear a NOTIFY sent through "
            "everystep's database %r within %gs: a pooler in transaction mode (PgBouncer) stands between "
            "the worker and PostgreSQL, or the two aliases name different databases. LISTEN is off: "
            "polling every %gs. Set EVERYSTEP_LISTEN_DATABASE to an alias that connects straight to "
            "PostgreSQL, to the same database.",
            self.name, database.listen_alias(), database.alias(), PROBE_TIMEOUT, self.poll,
        )

    def _reconnected(self, what: str, lost_at: float) -> None:
        # A warning, like the loss it ends: the two lines bracket the outage.
        logger.warning("worker %r: %s back after %.1fs", self.name, what, time.monotonic() - lost_at)
        observability.reconnected(self.name)

    def _on_notice(self, channel: str, payload: str) -> None:
        if channel == CONTROL_CHANNEL:
            try:
                run_id = uuid.UUID(payload)
            except ValueError:
                return
            with self._lock:
                slot = self._inflight.get(run_id)
                if slot is None:  # perhaps claimed here, its slot not seated yet: _seat sees it
                    now = time.monotonic()
                    heard = self._early_notices.items()
                    kept = {key: at for key, at in heard if now - at < EARLY_NOTICE_KEPT}
                    self._early_notices = {**kept, run_id: now}
            if slot is not None:
                slot.left = True
        elif channel == NOTIFY_CHANNEL:
            self._waker.wake()


def exit_now_if_abandoned(worker: Worker) -> None:
    """After a timed-out drain, a step may still be running on a pool thread;
    the interpreter would wait for it at exit, so leave without waiting (its
    run is requeued already and its write will be fenced out)."""
    if worker.abandoned:
        logging.shutdown()
        os._exit(0)
