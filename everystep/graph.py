"""The intended step structure of a workflow, read from its source without running it.

``intended_steps(func)`` parses the body (``inspect.getsource`` + ``ast``) and walks it in
the order Python evaluates it, counting step and ``parallel`` calls per scope as the runtime
does. Guarantee: when ``reason`` is ``None``, ``steps`` holds exactly the (id, qualified
name) pairs a run that raises nothing records, in call order (a fork's branches in branch
order; at run time they interleave), and ``forks`` the ``parallel`` ids. Otherwise both are
empty and ``reason`` names the construct, its line and why. It never raises.

Followed: statements, ``with`` blocks and expressions in evaluation order; helpers (also
through project decorators, class attributes and module-level objects) and ``@workflow``
functions called from the body, inlined in the caller's scope; ``parallel`` branches that
are lambdas, steps, helpers or lists of them. Loops, conditions, ``try``, comprehensions and
assert messages are fine while they call no step (and no ``return`` inside one precedes a
step). Anything else that could call a step is refused: steps in loops or conditions, ids
that are not string literals, calls through local names, ``self`` or computed expressions,
steps passed as values or wrapped by library code, ``*branches``, recursion, missing source,
and a module-level object whose hidden code calls steps (``__call__``, ``__enter__`` or
``__exit__`` of its class, a property read on it).

Assumed, not checked: methods of values computed at run time (``order.save()`` on a local
``order``), instantiating classes and library code (stdlib, site-packages, everystep) call
no steps, nor does hidden code (``__call__``, ``__enter__``, a property) that the analysis
cannot follow itself (a call through ``self``), and context managers do not swallow
exceptions.
"""

import __future__

import ast
import builtins
import functools
import inspect
import sysconfig
import textwrap
import types
from dataclasses import dataclass, field, replace

from .context import MAX_STEP_ID_LENGTH

__all__ = ["IntendedGraph", "intended_steps"]


@dataclass
class IntendedGraph:
    steps: list[tuple[str, str]] = field(default_factory=list)  # (step id, qualified name)
    forks: list[str] = field(default_factory=list)
    reason: str | None = None  # why the structure is not known statically

    @property
    def step_ids(self) -> list[tuple[str, str]]:
        """The name ``everystep_ui.tree`` reads: the same (id, name) pairs as ``steps``."""
        return self.steps


def intended_steps(func) -> IntendedGraph:
    """The step ids a run of ``func`` (a ``@workflow``, or its plain function) records."""
    try:
        spec = _spec(func)
        if spec is not None and spec.kind != "workflow":
            return IntendedGraph(reason=f"{spec.name} is a step, not a workflow")
        body = spec.func if spec else func
        if not isinstance(body, types.FunctionType):
            return IntendedGraph(reason=f"{body!r} is not a Python function")
        from . import waits
        from .api import parallel, start_child  # not at import time: they load the models

        walker = _Walker(parallel)
        # The waits take one step id each, like a step (everystep_id by keyword
        # only: after this many positional arguments it would be given by position).
        walker.waits = {waits.sleep: (waits.SLEEP, 1), waits.sleep_until: (waits.SLEEP, 1)}
        walker.waits[waits.wait_for_event] = (waits.WAIT_FOR_EVENT, 2)
        walker.start_child = start_child
        walker.inline(body, None, body=True)
        return IntendedGraph(walker.steps, walker.forks)
    except _Unsure as exc:
        return IntendedGraph(reason=str(exc))
    except RecursionError:
        return IntendedGraph(reason="the body is nested too deeply to analyse")
    except Exception as exc:  # whatever the body holds, the page must render
        return IntendedGraph(reason=f"the analysis failed ({type(exc).__name__}: {exc})")


class _Unsure(Exception):
    """The ids cannot be known statically; the message says where and why."""


@dataclass(frozen=True)
class _Method:
    """A user function reached through a class or an object: its ``self`` is unknown."""

    func: types.FunctionType


_LOCAL, _VALUE = object(), object()  # a local variable; a value whose methods call no steps
_LIBRARY = tuple({sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")})
_LAZY = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_DEPENDS, _COUNT = "which steps run depends on the data", "the number of steps depends on the data"
_AT_RUN_TIME = "is only known at run time"
# statement -> (the part always evaluated once, what it is, why it is refused)
_COMPOUND = {
    ast.If: ("test", "an if statement", _DEPENDS),
    ast.For: ("iter", "a for loop", _COUNT),
    ast.While: (None, "a while loop", _COUNT),
    ast.Try: (None, "a try statement", "which steps run depends on which fail"),
    ast.TryStar: (None, "a try statement", "which steps run depends on which fail"),
    ast.Match: ("subject", "a match statement", _DEPENDS),
    ast.ClassDef: (None, "a class statement", "its body is not followed"),
    ast.Assert: ("test", "an assert message", "it runs only if the assertion fails"),
}
# expressions that may skip parts -> (what it is, how many leading parts surely run)
_SHORT_CIRCUIT = {
    ast.IfExp: ("a conditional expression", 1),
    ast.BoolOp: ("an and/or expression", 1),
    ast.Compare: ("a chained comparison", 2),
}


def _spec(obj):
    try:
        spec = inspect.getattr_static(obj, "__everystep__")
    except AttributeError:
        return None
    return spec if getattr(spec, "kind", None) in ("step", "workflow") else None


def _is_user_function(obj) -> bool:
    if not isinstance(obj, types.FunctionType):
        return False
    package = (obj.__module__ or "").partition(".")[0]
    return package != "everystep" and not obj.__code__.co_filename.startswith((*_LIBRARY, "<frozen"))


def _returns(node) -> bool:
    """Whether a ``return`` inside ``node`` (not in a nested function) can leave the function."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        child = todo.pop()
        if isinstance(child, ast.Return):
            return True
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            todo.extend(ast.iter_child_nodes(child))
    return False


def _bound(nodes) -> set[str]:
    """Names bound by lambda parameters or comprehension targets."""
    found = set()
    for node in nodes:
        if isinstance(node, ast.arguments):
            params = (*node.posonlyargs, *node.args, *node.kwonlyargs, node.vararg, node.kwarg)
            found.update(p.arg for p in params if p)
        else:
            found.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
    return found


@dataclass
class _Frame:
    """A function whose source is being walked."""

    name: str
    node: ast.FunctionDef
    namespaces: tuple[dict, ...]  # closure cells, globals, builtins
    locals: frozenset
    body: bool  # the workflow body itself: messages say just "line N"
    owner: str | None = None  # a method's self or cls parameter
    exit: str | None = None  # set by a conditional return: later steps may not run
    annotations: bool = True  # defs here evaluate their annotations (no __future__ annotations)

    @classmethod
    def of(cls, func, *, body: bool, method: bool = False) -> "_Frame":
        name = f"{func.__module__}.{func.__qualname__}"
        try:
            lines, start = inspect.getsourcelines(func)
            tree = ast.parse(textwrap.dedent("".join(lines)))
        except (OSError, TypeError, SyntaxError):
            raise _Unsure(f"the source of {name} is not available") from None
        node = tree.body[0] if tree.body else None
        if not isinstance(node, ast.FunctionDef) or node.name != func.__name__:
            raise _Unsure(f"the source of {name} is not a plain def statement")
        code = func.__code__
        if code.co_flags & _LAZY:
            raise _Unsure(f"{name} is a generator or async function: its steps run lazily")
        ast.increment_lineno(tree, start - 1)
        cells = {}
        for var, cell in zip(code.co_freevars, func.__closure__ or (), strict=True):
            try:
                cells[var] = cell.cell_contents
            except ValueError:  # not assigned yet in the enclosing function
                cells[var] = _LOCAL
        namespaces = (cells, func.__globals__, vars(builtins))
        local_names = frozenset(code.co_varnames + code.co_cellvars)
        owner = code.co_varnames[0] if method and code.co_argcount else None
        # The future import makes the annotations of defs in this source strings, never run.
        annotations = not code.co_flags & __future__.annotations.compiler_flag
        return cls(name, node, namespaces, local_names, body, owner, annotations=annotations)


class _Walker:
    """Walks bodies in evaluation order, numbering calls as the runtime's scopes do."""

    def __init__(self, parallel, stack=()):
        self.parallel = parallel
        self.steps: list[tuple[str, str]] = []
        self.forks: list[str] = []
        self.frames: list[_Frame] = []
        self.stack = list(stack)  # code objects being inlined, against recursion
        self.prefix, self.counter, self.names = "", 0, set()
        self.waits: dict = {}  # wait function -> (step name, positional arguments before everystep_id)
        self.start_child = None

    def unsure(self, node, text: str) -> _Unsure:
        if node is None or not self.frames:
            return _Unsure(text)
        frame = self.frames[-1]
        return _Unsure(f"line {node.lineno}{'' if frame.body else f' of {frame.name}'}: {text}")

    def next_id(self, node, keywords) -> str:
        if any(k.arg is None for k in keywords):
            raise self.unsure(node, f"** arguments may carry an everystep_id: the id {_AT_RUN_TIME}")
        given = [k.value for k in keywords if k.arg == "everystep_id"]
        name = given[0].value if given and isinstance(given[0], ast.Constant) else None
        if given and not (isinstance(name, str) or name is None and isinstance(given[0], ast.Constant)):
            raise self.unsure(node, f"everystep_id is not a string literal: the id {_AT_RUN_TIME}")
        if name is not None and (not name or "." in name or name.isdigit() or name in self.names):
            raise self.unsure(
                node, f"the runtime refuses everystep_id {name!r} (empty, dotted, digits or reused)"
            )
        self.counter += 1
        self.names.add(name)  # None included: harmless, it is never looked up
        step_id = f"{self.prefix}{self.counter if name is None else name}"
        if len(step_id) > MAX_STEP_ID_LENGTH:
            raise self.unsure(node, f"the step id is longer than {MAX_STEP_ID_LENGTH} characters")
        exits = [frame.exit for frame in self.frames if frame.exit]
        if exits:
            raise _Unsure(exits[0])
        return step_id

    def visit(self, nodes, bound=()) -> None:
        """Walk nodes in order, with extra local names (lambda parameters, loop targets)."""
        frame = self.frames[-1]
        self.frames[-1] = replace(frame, locals=frame.locals | bound) if bound else frame
        try:
            for node in nodes:
                if isinstance(node, ast.stmt):
                    self.stmt(node)
                elif isinstance(node, ast.expr):
                    self.expr(node)
                elif node is not None:  # handlers, match cases, patterns, keywords
                    self.visit(ast.iter_child_nodes(node))
        finally:
            frame.exit = frame.exit or self.frames[-1].exit
            self.frames[-1] = frame

    def probe(self, node, text: str, nodes, bound=()) -> None:
        """Walk code that may run zero or many times: it must not call a step."""
        before = len(self.steps), len(self.forks), self.counter
        self.visit(nodes, bound)
        if (len(self.steps), len(self.forks), self.counter) != before:
            raise self.unsure(node, text)

    # ------------------------------------------------------------ functions and names

    def inline(self, func, node, *, body: bool = False, method: bool = False) -> None:
        if func.__code__ in self.stack:
            raise self.unsure(node, f"{func.__name__} calls itself: the depth depends on the data")
        try:
            frame = _Frame.of(func, body=body, method=method)
        except _Unsure as exc:
            raise self.unsure(node, str(exc)) from None
        self.frames.append(frame)
        self.stack.append(func.__code__)
        try:
            self.stmts(frame.node.body)
        finally:
            self.frames.pop()
            self.stack.pop()

    def classify(self, obj, node, label: str):
        """What calling ``obj`` does: ("step", name), ("inline", func), ("parallel"|"none", None)."""
        if obj is _LOCAL:
            raise self.unsure(node, f"a call through the local name {label}: the function {_AT_RUN_TIME}")
        if obj is _VALUE:
            return "none", None
        if obj is self.parallel:
            return "parallel", None
        if isinstance(obj, _Method):
            return "method", obj.func
        spec = _spec(obj)
        if spec is not None:
            return ("step", spec.name) if spec.kind == "step" else ("inline", spec.func)
        obj = obj.__func__ if isinstance(obj, types.MethodType) else obj
        if _is_user_function(obj):
            return "inline", obj
        if obj is eval or obj is exec:
            raise self.unsure(node, f"{label}: the code it runs is not analysed")
        self.check_hidden(obj, ("__call__",), node, label)
        try:
            wrapped = (
                obj.func if isinstance(obj, functools.partial) else inspect.getattr_static(obj, "__wrapped__")
            )
        except AttributeError:
            return "none", None
        if self.runs_steps(wrapped, node, label):
            raise self.unsure(node, f"{label} wraps code that calls steps: how it calls it is not analysed")
        return "none", None

    def runs_steps(self, obj, node, label: str) -> bool:
        kind, func = self.classify(obj, node, label)
        if kind not in ("inline", "method"):
            return kind != "none"
        probe = _Walker(self.parallel, self.stack)
        probe.waits, probe.start_child = self.waits, self.start_child
        probe.inline(func, None, method=kind == "method")
        return bool(probe.steps or probe.forks)

    def check_hidden(self, obj, dunders: tuple, node, label: str) -> None:
        """Unsure when code that calls steps runs unseen: ``obj`` itself (a
        property's getter, ``dunders`` empty) or the user methods ``dunders``
        of its class (``__call__`` of a callable object, ``__enter__`` and
        ``__exit__`` of a context manager), which are not walked."""
        hidden = [obj] if not dunders else [inspect.getattr_static(type(obj), d, None) for d in dunders]
        for func in hidden:
            if not _is_user_function(func):
                continue
            try:
                calls_steps = self.runs_steps(_Method(func), node, label)
            except _Unsure:  # code it cannot follow (self._load()), assumed to call none, as before
                calls_steps = False
            if calls_steps:
                raise self.unsure(node, f"{label} runs code that calls steps unseen: it is not analysed")

    def resolve(self, node, *, callee: bool = False):
        """The object a name or dotted name refers to, ``_LOCAL`` or ``_VALUE``."""
        if isinstance(node, ast.Name):
            frame = self.frames[-1]
            if node.id in frame.locals:
                return _LOCAL
            for namespace in frame.namespaces:
                if node.id in namespace:
                    return namespace[node.id]
            raise self.unsure(node, f"the name {node.id} is not defined")
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            if isinstance(base, types.ModuleType):
                if not hasattr(base, node.attr):
                    raise self.unsure(node, f"{ast.unparse(node)} does not exist")
                return getattr(base, node.attr)
            if base is _LOCAL or base is _VALUE:
                return _VALUE  # a method of a value computed at run time
            try:  # a class or a module-level object: look without running descriptors
                found = inspect.getattr_static(base, node.attr)
            except AttributeError:
                return _VALUE
            if isinstance(found, staticmethod):
                return found.__func__
            if isinstance(found, property) and not isinstance(base, type):  # read: its getter runs
                self.check_hidden(found.fget, (), node, ast.unparse(node))
                return _VALUE
            found = found.__func__ if isinstance(found, classmethod) else found
            # A step or workflow kept on a class (Steps.ping) is itself, not a method to walk.
            return _Method(found) if _is_user_function(found) and _spec(found) is None else found
        if callee:
            raise self.unsure(node, f"a call through {ast.unparse(node)}: the function {_AT_RUN_TIME}")
        self.expr(node)
        return _VALUE

    # ------------------------------------------------------------ statements

    def stmts(self, body) -> bool:
        """Walk statements; True once one leaves the function (return, raise)."""
        return any(self.stmt(statement) for statement in body)

    def stmt(self, s) -> bool:
        if type(s) in _COMPOUND:
            head, what, why = _COMPOUND[type(s)]
            self.expr(getattr(s, head) if head else None)
            rest = [c for c in ast.iter_child_nodes(s) if head is None or c is not getattr(s, head)]
            self.probe(s, f"{what} with steps inside: {why}", rest)
            if _returns(s) and not self.frames[-1].exit:
                where = str(self.unsure(s, "")).removesuffix(" ")
                self.frames[-1].exit = f"{where} a return inside {what}: the steps after it may not run"
        elif isinstance(s, ast.With):
            self.visit(s.items)
            for item in s.items:
                if isinstance(item.context_expr, ast.Name | ast.Attribute):
                    label = ast.unparse(item.context_expr)
                    self.check_hidden(self.resolve(item.context_expr), ("__enter__", "__exit__"), s, label)
            return self.stmts(s.body)
        elif isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef):  # defining runs no body
            self.visit([*s.decorator_list, *s.args.defaults, *s.args.kw_defaults])
            if self.frames[-1].annotations:  # then the annotations, in CPython's order
                args = s.args
                params = (*args.args, *args.posonlyargs, args.vararg, *args.kwonlyargs, args.kwarg)
                self.visit([*(p.annotation for p in params if p), s.returns])
        elif isinstance(s, ast.Assign | ast.AnnAssign):  # the value runs before the targets
            self.visit([s.value, *(s.targets if isinstance(s, ast.Assign) else [s.target])])
        elif isinstance(s, ast.AsyncWith | ast.AsyncFor):
            raise self.unsure(s, "async code is not analysed")
        else:
            self.visit(ast.iter_child_nodes(s))
            return isinstance(s, ast.Return | ast.Raise)
        return False

    # ------------------------------------------------------------ expressions

    def expr(self, node) -> None:
        if node is None:
            return
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(getattr(node, "ctx", None), ast.Store | ast.Del):
            if isinstance(node, ast.Attribute | ast.Subscript | ast.Starred | ast.Tuple | ast.List):
                self.visit(ast.iter_child_nodes(node))
        elif isinstance(node, ast.Name | ast.Attribute):
            obj, label = self.resolve(node), ast.unparse(node)
            if (callable(obj) or isinstance(obj, _Method)) and self.runs_steps(obj, node, label):
                raise self.unsure(node, f"{label} is used as a value, not called: when it runs is unknown")
        elif isinstance(node, ast.Lambda):
            self.visit([*node.args.defaults, *node.args.kw_defaults])
            text = "a lambda that calls steps outside parallel: when it runs is unknown"
            self.probe(node, text, [node.body], _bound([node.args]))
        elif type(node) in _SHORT_CIRCUIT:  # only the first part surely runs
            what, once = _SHORT_CIRCUIT[type(node)]
            parts = [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]
            self.visit(parts[:once])
            self.probe(node, f"{what} with steps inside: {_DEPENDS}", parts[once:])
        elif isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            first, *more = node.generators
            self.expr(first.iter)  # the only part that runs exactly once
            rest = [*first.ifs, *more, *(c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr))]
            names = _bound(g.target for g in node.generators)
            self.probe(node, f"a comprehension with steps inside: {_COUNT}", rest, names)
        elif isinstance(node, ast.Dict):
            self.visit([part for pair in zip(node.keys, node.values, strict=True) for part in pair])
        else:
            self.visit(ast.iter_child_nodes(node))

    def call(self, node) -> None:
        base, owner = getattr(node.func, "value", None), self.frames[-1].owner
        through_self = owner is not None and isinstance(base, ast.Name) and base.id == owner
        if through_self or isinstance(base, ast.Call) and getattr(base.func, "id", None) == "super":
            raise self.unsure(node, f"a call through {ast.unparse(node.func)}: the method {_AT_RUN_TIME}")
        obj = self.resolve(node.func, callee=True)
        if obj is self.parallel:
            return self.fork(node)
        if obj is self.start_child and obj is not None:
            raise self.unsure(
                node, "start_child() starts a child run: the wait of its handle's result() is not followed"
            )
        wait = self.waits.get(obj) if isinstance(obj, types.FunctionType) else None
        if wait is not None:
            return self.wait(node, *wait)
        self.visit([*node.args, *node.keywords])  # arguments run before the call takes its id
        self.invoke(node, obj, node.keywords, ast.unparse(node.func))

    def invoke(self, node, obj, keywords, label: str) -> None:
        kind, target = self.classify(obj, node, label)
        if kind == "step":
            self.steps.append((self.next_id(node, keywords), target))
        elif kind == "parallel":
            raise self.unsure(node, "parallel passed as a branch of parallel")
        elif any(k.arg == "everystep_id" for k in keywords):
            raise self.unsure(node, f"everystep_id passed to {label}, which is not a step")
        elif kind in ("inline", "method"):
            self.inline(target, node, method=kind == "method")

    def wait(self, node, name: str, positional: int) -> None:
        """A sleep or an event wait: one step id, taken after its arguments run."""
        if len(node.args) > positional or any(isinstance(arg, ast.Starred) for arg in node.args):
            label = ast.unparse(node.func)
            raise self.unsure(node, f"{label}() given everystep_id by position: the id {_AT_RUN_TIME}")
        self.visit([*node.args, *node.keywords])
        self.steps.append((self.next_id(node, node.keywords), name))

    def fork(self, node) -> None:
        if any(isinstance(arg, ast.Starred) for arg in node.args):
            raise self.unsure(node, f"parallel branches passed with *: their number {_AT_RUN_TIME}")
        if any(k.arg not in (None, "everystep_id") for k in node.keywords):
            raise self.unsure(node, "parallel() called with an unknown keyword")
        branches = []  # branch expressions are evaluated before the fork takes its id
        for arg in node.args:
            items = arg.elts if isinstance(arg, ast.List | ast.Tuple) else [arg]
            for item in items:
                if not isinstance(item, ast.Lambda | ast.Name | ast.Attribute):
                    raise self.unsure(item, f"the parallel branch {ast.unparse(item)} {_AT_RUN_TIME}")
            branches.append([(item, self.branch_target(item)) for item in items])
        fork_id = self.next_id(node, node.keywords)
        self.forks.append(fork_id)
        saved = self.prefix, self.counter, self.names
        try:
            for index, items in enumerate(branches):
                self.prefix, self.counter, self.names = f"{fork_id}.{index}.", 0, set()
                for item, obj in items:
                    if isinstance(item, ast.Lambda):
                        self.visit([item.body], _bound([item.args]))
                    else:
                        self.invoke(item, obj, [], ast.unparse(item))
        finally:
            self.prefix, self.counter, self.names = saved

    def branch_target(self, item):
        if isinstance(item, ast.Lambda):
            args = item.args
            if len(args.posonlyargs) + len(args.args) > len(args.defaults) or None in args.kw_defaults:
                raise self.unsure(item, "a parallel branch lambda with required parameters")
            return self.visit([*args.defaults, *args.kw_defaults])
        obj = self.resolve(item)
        if obj is _LOCAL:
            raise self.unsure(
                item, f"the parallel branch {ast.unparse(item)} is a local name: the function {_AT_RUN_TIME}"
            )
        return obj
