"""A workflow whose body is described by data, rich enough to compare a crashed
and resumed run with the uncrashed run of the same shape
(tests/reliability/test_replay_equivalence.py).

A shape is a list of nodes:

- ``["step", name, label, behaviour, unsafe]``: a step call, named
  ``everystep_id=name`` (or positional when ``name`` is None). ``behaviour`` is
  ``"ok"`` (returns ``label``), ``"fail"`` (raises ``ValueError(label)``) or
  ``"terminal"`` (raises ``Terminal``); ``unsafe`` marks it unsafe to repeat;
- ``["fork", name, branches]``: a ``parallel`` call; each branch is
  ``["one", nodes]`` (one callable) or ``["seq", [nodes, ...]]`` (a sequence
  branch: callables run in order on one thread, sharing one scope);
- ``["try", body, handler]``: runs ``body``; on any ``Exception`` (a failed
  step, a ``Terminal``, an ``ExceptionGroup``) runs ``handler``, the durable
  cleanup.

The branches of a fork run on their own threads through the engine's
``parallel``, but in branch order: branch i starts its first step once branch
i-1 has finished. That makes a run of a shape deterministic (which sibling
steps ran before a ``Terminal`` stopped the run is otherwise a race), so an
uncrashed run is a reference a resumed one can be compared with exactly. A
crash plan can hand a branch's turn on early (``turns.finish``) to leave that
branch's last step in flight while its later siblings run.
"""

import threading
from collections import Counter

from everystep import Terminal, context, parallel, step, workflow

TURN_TIMEOUT = 60  # seconds; a harness deadlock fails loudly instead of hanging

executions: Counter = Counter()  # step id -> how many times its function ran
returned: dict = {}  # step id -> the value its function returned
labels: dict = {}  # step id -> the label of its node
# Test hook: ``after_call(label)`` once a step call returned or raised (its record written).
after_call = None
_lock = threading.Lock()


class HarnessError(BaseException):
    """The harness itself went wrong (e.g. waited too long for a turn): a
    BaseException, so that no ``except Exception`` in a shape swallows it."""


class Turns:
    """Which fork branches have finished (or handed their turn on) in this pass.
    A scope is a branch's dotpath prefix, ``"<fork id>.<i>."``."""

    def __init__(self):
        self._finished: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def _event(self, scope: str) -> threading.Event:
        with self._lock:
            return self._finished.setdefault(scope, threading.Event())

    def reset(self) -> None:
        with self._lock:
            self._finished = {}

    def finish(self, scope: str) -> None:
        self._event(scope).set()

    def wait_for_previous(self, scope: str) -> None:
        fork, index = scope[:-1].rsplit(".", 1)
        if int(index) == 0:
            return
        previous = f"{fork}.{int(index) - 1}."
        if not self._event(previous).wait(TURN_TIMEOUT):
            raise HarnessError(f"branch {scope} waited {TURN_TIMEOUT}s for {previous} to finish")


turns = Turns()


def reset() -> None:
    """Forget what earlier runs did (call before each run of a shape)."""
    with _lock:
        executions.clear()
        returned.clear()
        labels.clear()
    turns.reset()


def new_pass() -> None:
    """Before each pass over a run (first pass, resume): branch turns start afresh."""
    turns.reset()


def _act(label, behaviour):
    step_id = context.current().running_step
    with _lock:
        executions[step_id] += 1
        labels[step_id] = label
    if behaviour == "fail":
        raise ValueError(label)
    if behaviour == "terminal":
        raise Terminal(f"stop at {label}", {"label": label})
    with _lock:
        returned[step_id] = label
    return label


@step
def act(label, behaviour):
    return _act(label, behaviour)


@step(unsafe_to_repeat=True)
def act_once(label, behaviour):
    return _act(label, behaviour)


def interpret(nodes) -> list:
    out = []
    for node in nodes:
        if node[0] == "step":
            _, name, label, behaviour, unsafe = node
            call = act_once if unsafe else act
            try:
                out.append(call(label, behaviour, everystep_id=name))
            finally:
                if after_call is not None:
                    after_call(label)
        elif node[0] == "fork":
            out.append(parallel(*[_branch(branch) for branch in node[2]], everystep_id=node[1]))
        else:
            try:
                out.append(interpret(node[1]))
            except Exception as exc:
                out.append(["caught", type(exc).__name__, str(exc), interpret(node[2])])
    return out


def _branch(branch):
    kind, body = branch
    if kind == "one":
        return _in_turn(body, first=True, last=True)
    return [
        _in_turn(part, first=k == 0, last=k == len(body) - 1) for k, part in enumerate(body)
    ]


def _in_turn(nodes, *, first: bool, last: bool):
    """One callable of a branch: the first waits for the previous branch, the
    last (or any that raises, ending the branch) finishes the branch's turn."""

    def run():
        scope = context.current().prefix
        if first:
            turns.wait_for_previous(scope)
        try:
            result = interpret(nodes)
        except BaseException:
            turns.finish(scope)
            raise
        if last:
            turns.finish(scope)
        return result

    return run


@workflow
def replayed(shape):
    return interpret(shape)


def branch_scopes(step_id: str) -> list[tuple[str, int]]:
    """``(fork id, branch index)`` of every fork a step id lies in, outermost first:
    a dotpath alternates fork, branch, fork, branch, ..., step."""
    parts = step_id.split(".")
    return [(".".join(parts[: 2 * k + 1]), int(parts[2 * k + 1])) for k in range(len(parts) // 2)]
