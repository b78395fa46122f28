"""A workflow whose body is described by data, so that property tests can run
random shapes of steps, named ids, forks and sequence branches.

A shape is a list of nodes: ``["step", name]`` or ``["fork", name, branches]``
where ``name`` is None (positional id) or a name, and each branch is
``["one", nodes]`` (a callable running ``nodes``) or ``["seq", [nodes, ...]]``
(a sequence branch: callables run in order on one thread, sharing one scope).
"""

from everystep import parallel, step, workflow


@step
def leaf(label):
    return label


def interpret(nodes):
    for node in nodes:
        if node[0] == "step":
            leaf("x", everystep_id=node[1])
        else:
            parallel(*[_branch(b) for b in node[2]], everystep_id=node[1])


def _branch(branch):
    kind, body = branch
    if kind == "one":
        return lambda: interpret(body)
    return [lambda nodes=nodes: interpret(nodes) for nodes in body]


@workflow
def shaped(shape):
    interpret(shape)


def expected_ids(nodes, prefix=""):
    """The ids the spec assigns to a shape (steps only), computed independently."""
    ids = []
    for counter, node in enumerate(nodes, start=1):
        own = f"{prefix}{node[1] if node[1] is not None else counter}"
        if node[0] == "step":
            ids.append(own)
            continue
        for i, (kind, body) in enumerate(node[2]):
            scope = f"{own}.{i}."
            if kind == "one":
                ids += expected_ids(body, scope)
            else:  # one scope shared by the callables of a sequence branch
                ids += expected_ids([n for part in body for n in part], scope)
    return ids
