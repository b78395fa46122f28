"""The running workflow's context, one per thread.

A run has one :class:`RunState` (identity, outcome store, halt) shared by all
its threads; each scope (the body, each ``parallel`` branch) has its own
:class:`Context` with its own step counter.
"""

import threading
import types
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.db import connections

from . import serde
from .errors import EverystepError, Suspended

MAX_STEP_ID_LENGTH = 300
_local = threading.local()


@dataclass(frozen=True)
class Outcome:
    """A recorded step: status ``done``, ``failed`` or ``started``."""

    status: str
    name: str
    result: Any = None
    error: dict | None = None

    def exception(self) -> BaseException:
        """A fresh instance of the recorded exception."""
        from .serde import decode_exception

        return decode_exception(self.error)


class RunState:
    """What all threads of one run share. ``halt`` is the first control
    exception raised (Terminal, divergence, uncertainty, drain, crash), or a
    wait's ``Suspended`` until one of those replaces it: once set, no further
    step starts, whatever the body catches."""

    def __init__(self, workflow_id, name: str, claimer: str, leave_check: Callable | None = None):
        self.workflow_id = workflow_id
        self.workflow_text = str(workflow_id)  # as each step's insert sends it
        self.name = name
        self.claimer = claimer
        self.store: dict[str, Outcome] = {}
        self.halt: BaseException | None = None
        # Every wait a scope stopped at this pass (``Waiting``s, in order), not
        # only the one that set ``halt``: in a parallel fork several branches can
        # reach their wait, and each must be able to wake the run (its wake time,
        # its event key), so the suspension writes a wait row for each.
        self.suspended: list = []
        self.engine_error: BaseException | None = None
        self.leave_check = leave_check
        # The step executing now in each scope (a Context: its running_step),
        # kept in memory for the worker's heartbeat to report; no write per step.
        self.executing: dict[Context, str] = {}
        # Set by the runner once per run: EVERYSTEP_DATABASE, EVERYSTEP_PREPARED_STATEMENTS.
        self.database = "default"
        self.prepared_statements = True
        self._lock = threading.Lock()
        self._connections: dict[threading.Thread, Any] = {}  # see connection()

    def connection(self):
        """This thread's connection to everystep's database. Looked up once per
        thread of the run (its body, each ``parallel`` branch): Django's lookup
        follows async contexts, and costs microseconds per step. By thread
        object, not ident: a branch thread's ident may be reused by a later one."""
        thread = threading.current_thread()
        conn = self._connections.get(thread)
        if conn is None:
            conn = self._connections[thread] = connections[self.database]
        return conn

    def halt_with(self, exc: BaseException):
        with self._lock:
            # A wait only defers the run; any other halt must decide how this pass
            # ends (stopped, blocked, failed, or handed back for a replay), so it
            # replaces a sibling branch's wait: a run that recorded a Terminal
            # ends stopped instead of waiting, then waking to go on.
            if self.halt is None or (isinstance(self.halt, Suspended) and not isinstance(exc, Suspended)):
                self.halt = exc
            if isinstance(exc, Suspended):
                self.suspended.append(exc.waiting)
        raise exc

    def executing_steps(self) -> list[str]:
        """Ids of the steps whose functions run now (one per active scope); safe
        to call from another thread."""
        return sorted(self.executing.copy().values())  # copy(): atomic under the GIL

    def check(self) -> None:
        """Raise the halt, or halt if the worker wants the run back (drain, fence)."""
        if self.halt is not None:
            raise self.halt
        if self.leave_check is not None:
            reason = self.leave_check()
            if reason is not None:
                self.halt_with(reason)


class Context:
    """One scope of a running workflow: the body, or one ``parallel`` branch.

    Get the current one with :func:`current`; everystep makes them. Inside a
    step's function, ``running_step`` is that step's id (``None`` between
    steps). ``workflow_id`` and the step id together make an idempotency key
    towards other systems, so that a step repeated after a crash is
    recognised there.
    """

    def __init__(self, state: RunState, prefix: str = ""):
        self.state = state
        self.prefix = prefix
        self._running_step: str | None = None
        self._counter = 0
        self._names: set[str] = set()

    @property
    def running_step(self) -> str | None:
        """Inside a step's function, that step's id; ``None`` between steps."""
        return self._running_step

    @running_step.setter
    def running_step(self, step_id: str | None) -> None:
        self._running_step = step_id
        if step_id is None:
            self.state.executing.pop(self, None)
        else:
            self.state.executing[self] = step_id

    @cached_property
    def connection(self):
        """This scope's connection to everystep's database, looked up on first
        use and then a plain attribute: a scope runs on one thread."""
        return self.state.connection()

    def refuse_transaction(self, what: str) -> None:
        """Halt the run when ``what`` (a step, a wait...) is called inside a
        transaction the project opened on everystep's connection: its record
        would be rolled back with that transaction (when the block exits with an
        exception, or the run suspends through it), so a replay would run it
        again. Called only when ``connection.in_atomic_block``; the blocks a
        Django ``TestCase`` opens around a test do not count."""
        blocks = self.connection.atomic_blocks
        if all(getattr(block, "_from_testcase", False) for block in blocks):
            return
        self.state.halt_with(
            EverystepError(
                f"run {self.workflow_id}: {what} was called inside transaction.atomic() on "
                f"everystep's database ({self.state.database!r}) in the workflow's body. Its record "
                "would be rolled back with that transaction, and the call would run again on "
                "replay. Commit the transaction before the call (end the atomic block first); a "
                "step's own function may use transactions freely."
            )
        )

    @property
    def workflow_id(self):
        """The run's id (a UUID), the primary key of its ``everystep_workflow`` row."""
        return self.state.workflow_id

    @property
    def workflow_name(self) -> str:
        """The workflow's registered name, ``module.qualname``."""
        return self.state.name

    @property
    def outcomes(self) -> types.MappingProxyType:
        """Recorded outcomes keyed by step id (read-only, values decoded)."""
        return types.MappingProxyType(self.state.store)

    def next_id(self, everystep_id: str | None = None) -> str:
        """Advance this scope's counter and return the full dotpath of the call."""
        self._counter += 1
        if everystep_id is None:
            return self._bounded(f"{self.prefix}{self._counter}")
        if not isinstance(everystep_id, str) or not everystep_id:
            raise EverystepError(
                f"everystep_id must be a non-empty string, got {everystep_id!r} ({self._where()})"
            )
        problem = serde.unstorable_text(everystep_id)
        if problem:
            raise EverystepError(
                f"everystep_id {everystep_id!r} cannot be stored: {problem} ({self._where()})"
            )
        if "." in everystep_id:
            raise EverystepError(
                f"everystep_id {everystep_id!r} contains '.', which separates dotpath levels "
                f"({self._where()})"
            )
        if everystep_id.isdigit():
            raise EverystepError(
                f"everystep_id {everystep_id!r} is all digits and could collide with positional ids "
                f"({self._where()})"
            )
        if everystep_id in self._names:
            raise EverystepError(
                f"everystep_id {everystep_id!r} is used twice in one scope ({self._where()})"
            )
        step_id = self._bounded(f"{self.prefix}{everystep_id}")
        self._names.add(everystep_id)
        return step_id

    def _bounded(self, step_id: str) -> str:
        if len(step_id) > MAX_STEP_ID_LENGTH:
            raise EverystepError(
                f"step id {step_id[:60]}... is {len(step_id)} characters; the limit is "
                f"{MAX_STEP_ID_LENGTH} for the full dotpath ({self._where()}). "
                "Use a shorter everystep_id or nest fewer forks."
            )
        return step_id

    def _where(self) -> str:
        """Where a refused id was asked for, for the error message (built only then:
        every step call passes here)."""
        return f"run {self.workflow_id}, scope {self.prefix or '(top)'}"

    def child(self, prefix: str) -> "Context":
        return Context(self.state, prefix)


def current() -> Context | None:
    """The running workflow's context on this thread, or ``None`` outside a run."""
    return getattr(_local, "context", None)


@contextmanager
def activate(context: Context | None):
    previous = current()
    _local.context = context
    try:
        yield context
    finally:
        _local.context = previous
