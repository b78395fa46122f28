"""Every exception everystep raises derives from ``EverystepError``.

Messages name the run, the step, what went wrong and what to do next.
"""


class EverystepError(Exception):
    """Base class of everything everystep raises."""


class WorkflowCodeError(EverystepError):
    """The workflow's code no longer matches what the run recorded (divergence)."""


class WorkflowImportError(EverystepError):
    """A module of workflows raised while being imported, so a worker refuses to
    start. ``failures`` holds each module's ``registry.ImportFailure`` (its
    exception, where it was raised and the traceback)."""

    def __init__(self, message, failures=()):
        super().__init__(message)
        self.failures = list(failures)


class RefusedByDatabase(EverystepError):
    """The database refused to store a value that encoded (MariaDB's JSON
    check refuses nesting past 32 levels, which the other backends store);
    nothing was written. Raised by ``schedule()``, into the body for a step's
    record, and by the operations that store an operator's value. Its own
    class: the UI shows it next to the value's field, where an operator typed
    it, not as a run that moved on."""


class StepFailure(EverystepError):
    """A recorded step failure whose original exception cannot be rebuilt,
    or a failure an operator recorded when resolving a blocked run."""


class EffectUncertain(EverystepError):
    """An unsafe-to-repeat step started but its outcome was never recorded."""


class SimulatedCrash(EverystepError):
    """Raised by a ``runner.fault`` hook to end a run as a process death would."""


class DrainOrphan(EverystepError):
    """Internal: the run must leave this worker at the next step boundary
    (the worker is draining, or the run was stopped, requeued or taken over)."""


class Fenced(DrainOrphan):
    """Internal: the run is no longer ``running`` under this worker's name."""


class Terminal(EverystepError):
    """Raised by a step to stop its run deliberately: the run ends ``stopped``.

    ``reason`` is a short human sentence; ``payload`` any serializable detail.
    The step is recorded ``failed`` with the encoded ``Terminal`` and no
    further step of the run starts, even if the body catches it. A stop is
    not reported as a failure.
    """

    def __init__(self, reason, payload=None):
        super().__init__(reason, payload)
        self.reason = reason
        self.payload = payload

    def __str__(self):
        return str(self.reason)


class WaitTimeout(EverystepError):
    """Raised at :func:`~everystep.wait_for_event` when its timeout passed
    before the event was sent (or an operator woke the run with
    ``wake_now``). Recorded as the wait step's outcome, so replay raises it
    again; the body may catch it and go on."""


class Suspended(EverystepError):
    """Internal: the run stops at a wait (``waiting``) and leaves its worker.
    ``waiting`` is the :class:`everystep.waits.Waiting` it stops at."""

    def __init__(self, waiting):
        super().__init__(f"run waits at step {waiting.step_id} ({waiting.kind})")
        self.waiting = waiting


class ChildRunError(EverystepError):
    """Base of what ``handle.result()`` raises in a parent when its child run
    did not complete. ``child_id`` is the child's run id, ``error`` the
    child's stored error (``{"type", "message", "args"}``), and
    ``exception()`` rebuilds the child's own exception from it."""

    def __init__(self, message, child_id=None, error=None):
        super().__init__(message, child_id, error)
        self.child_id = child_id
        self.error = error

    def __str__(self):
        return str(self.args[0])

    def exception(self) -> BaseException:
        from .serde import decode_exception

        return decode_exception(self.error or {})


class ChildFailed(ChildRunError):
    """The child run ended ``failed`` (or was deleted before it ended)."""


class ChildStopped(ChildRunError):
    """The child run ended ``stopped``: a ``Terminal`` or an operator's Stop."""
