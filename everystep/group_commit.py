"""Steps recorded at the same moment by one worker's threads share a commit.

Each step is its own committed transaction when a thread records it alone.
With a fleet of threads, most of the server's work per step is the
transaction's, not the row's: its messages, its start, its commit and the
wait for the WAL flush. So while a write is on its way to the database, the
steps other threads record meanwhile queue up, and go out together as the
next write, one statement and one commit: the first of them sends it on its
own connection and hands each of the others its outcome. Every step is still
committed before the thread that recorded it goes on.

One write per process (per database) is in flight at a time, which is what
lets the next one gather; the leader of a write hands the lead to the first
thread that queued meanwhile, with everything queued so far, before waking
the threads it wrote for. (Two or three writes in flight gathered less and
cost more CPU per step, for no more steps per second: docs/performance.md.)
"""

import threading
from collections.abc import Callable
from typing import Any


class _Member:
    __slots__ = ("item", "woken", "batch", "outcome")

    def __init__(self, item):
        self.item = item
        # Released once: when this member's outcome is in, or when it leads.
        self.woken = threading.Lock()
        self.woken.acquire()
        self.batch: list[_Member] | None = None  # set when it leads a write
        self.outcome = None


class GroupCommit:
    """Gathers the items submitted while a write is in flight into the next one."""

    def __init__(self):
        self._lock = threading.Lock()
        self._queue: list[_Member] = []
        self._writing = False

    def submit(self, item, write: Callable[[list], list]) -> Any:
        """This item's outcome from ``write(items)`` (called on this thread, with
        this item first, or on another submitter's thread), raised when it is an
        exception. ``write`` returns one outcome per item, in order."""
        me = _Member(item)
        with self._lock:
            if not self._writing:  # then nothing is queued either
                self._writing = True
                me.batch = [me]
            else:
                self._queue.append(me)
        if me.batch is None:
            me.woken.acquire()
            if me.batch is None:
                return _given(me.outcome)
        batch = me.batch
        try:
            outcomes = write([member.item for member in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"{len(outcomes)} outcomes for {len(batch)} items")
        except BaseException as exc:  # a bug in ``write``: nobody may wait for ever
            outcomes = [exc] * len(batch)
        self._hand_over()
        for member, outcome in zip(batch[1:], outcomes[1:], strict=True):
            member.outcome = outcome
            member.woken.release()
        return _given(outcomes[0])

    def _hand_over(self) -> None:
        """The next write to the items queued during this one, led by the first."""
        with self._lock:
            if not self._queue:
                self._writing = False
                return
            successor = self._queue[0]
            successor.batch, self._queue = self._queue, []
        successor.woken.release()

    def queued(self) -> int:
        """Items waiting for the write in flight to end (tests wait on it)."""
        with self._lock:
            return len(self._queue)


def _given(outcome):
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome
