"""The step dotpath tree of a run: forks, branches and steps nested as ids nest.

A dotpath alternates scopes and items: ``3.0.1`` is step ``1`` of branch ``0``
of fork ``3``. Components at odd depths (1, 3, ...) are steps or forks, at even
depths branches. Recorded rows make step nodes; the workflow's statically
intended steps (``everystep.graph``) add ``pending`` nodes for what has not run.
"""

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from everystep import registry, waits

STATUS_LABELS = {
    "executing": "running now",
    "done": "done",
    "failed": "failed",
    "uncertain": "started (uncertain)",
    "in_flight": "in flight",
    "waiting": "waiting",
    "pending": "pending",
}


@dataclass(slots=True)  # a run page builds one per step: thousands of them
class Node:
    key: str  # the last component of the dotpath
    path: str
    depth: int
    step_pk: int | None = None
    name: str = ""
    status: str = ""  # set on step nodes only
    closes: int = 0  # nested lists that end after this node, in pre-order (see preorder)
    children: list["Node"] = field(default_factory=list)
    by_key: dict[str, "Node"] = field(default_factory=dict, repr=False)  # while building

    @property
    def kind(self) -> str:
        if self.status:
            return "step"
        return "branch" if self.depth % 2 == 0 else "fork"

    @property
    def status_label(self) -> str:
        return STATUS_LABELS.get(self.status, self.status)

    @property
    def closing(self) -> range:
        return range(self.closes)


@dataclass
class StepTree:
    roots: list[Node]
    nodes: list[Node]  # all of them in pre-order, to render nested lists in one loop
    counts: dict[str, int]  # step nodes per status
    intended_reason: str = ""  # why pending steps could not be derived, if they could not
    # A recorded step's payload page: this URL with STEP_PK replaced by the step's pk.
    step_url: str = ""


def step_status(row_status: str, run_status: str, name: str = "") -> str:
    """A ``started`` row is an unsafe step whose outcome is not recorded yet:
    in flight while its run runs, uncertain once the run has stopped running.
    A wait's ``started`` row (a sleep, an event wait) is where the run waits."""
    if row_status == "started" and waits.is_wait_step(name):
        return "in_flight" if run_status == "running" else "waiting"
    if row_status == "started":
        return "in_flight" if run_status == "running" else "uncertain"
    return row_status


def build_tree(
    steps: Iterable,
    run_status: str,
    intended: Iterable[tuple[str, str]] = (),
    executing: Iterable[str] = (),
) -> StepTree:
    """``steps`` are Step rows in recording order (only ``id``, ``step_id``,
    ``name`` and ``status`` are read); ``intended`` the (step id, function name)
    pairs the workflow body would record, in runtime order; ``executing`` the
    ids of the steps whose functions run now, as the worker last reported them."""
    top: dict[str, Node] = {}
    counts: Counter = Counter()
    for row in steps:
        node = _node_at(top, row.step_id)
        node.step_pk = row.id
        node.name = row.name
        node.status = step_status(row.status, run_status, row.name)
        counts[node.status] += 1
    for step_id, name in intended:
        node = _node_at(top, step_id)
        if not node.status:
            node.name = name
            node.status = "pending"
            counts["pending"] += 1
    for step_id in executing:
        node = _node_at(top, step_id)
        # The report may predate the step's record: a recorded outcome wins.
        if node.status in ("", "pending", "in_flight"):
            if node.status:
                counts[node.status] -= 1
            node.status = "executing"
            counts["executing"] += 1
    roots = _finish(top)
    counts = +counts  # drop the statuses no node has any more
    return StepTree(roots=roots, nodes=preorder(roots), counts=dict(counts))


def _node_at(top: dict[str, Node], step_id: str) -> Node:
    """The node for ``step_id``, creating it and its ancestors in insertion order."""
    if "." not in step_id:  # a top-level step: most of a long run's steps
        node = top.get(step_id)
        if node is None:
            node = top[step_id] = Node(key=step_id, path=step_id, depth=1)
        return node
    level = top
    node = None
    parts = step_id.split(".")
    for depth, key in enumerate(parts, start=1):
        node = level.get(key)
        if node is None:
            node = level[key] = Node(key=key, path=".".join(parts[:depth]), depth=depth)
        level = node.by_key
    return node


def _finish(level: dict[str, Node]) -> list[Node]:
    """Siblings in insertion order, with the numbered ones sorted numerically
    among the places numbered siblings hold (named ids keep their place)."""
    nodes = list(level.values())
    for node in nodes:
        if node.by_key:  # most nodes are leaves: no recursion for them
            node.children = _finish(node.by_key)
    numbered = iter(sorted((n for n in nodes if _is_number(n.key)), key=lambda n: int(n.key)))
    return [next(numbered) if _is_number(n.key) else n for n in nodes]


def preorder(roots: list[Node]) -> list[Node]:
    """The nodes in document order. Each node's ``closes`` counts the child lists
    that end right after it, so a template can nest ``<ul>`` without recursion
    (a recursive ``{% include %}`` costs too much for thousands of steps)."""
    flat: list[Node] = []

    def visit(level: list[Node]) -> None:
        for node in level:
            flat.append(node)
            if node.children:
                visit(node.children)
                flat[-1].closes += 1

    visit(roots)
    return flat


def _is_number(key: str) -> bool:
    return key.isascii() and key.isdigit()


def intended_steps(workflow_name: str) -> tuple[list[tuple[str, str]], str]:
    """The workflow's statically derived steps, or no steps and the reason why."""
    try:
        from everystep.graph import intended_steps as analyse
    except ImportError:
        return [], "static analysis is not available (everystep.graph is missing)"
    spec = registry.get_workflow(workflow_name)
    if spec is None:
        failure = registry.import_failure(workflow_name)
        if failure is not None:
            return [], f"its {failure.summary()}"
        return [], f"no workflow named {workflow_name} is registered in this process"
    try:
        graph = analyse(spec.func)
    except Exception as exc:  # an analysis bug must not take the run page down
        return [], f"the analysis failed ({type(exc).__name__}: {exc})"
    if getattr(graph, "reason", None):
        return [], str(graph.reason)
    return list(graph.step_ids or []), ""
