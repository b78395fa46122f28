"""Building the dotpath tree, without a database."""

from types import SimpleNamespace

from everystep_ui.tree import build_tree


def rows(*specs):
    """``("3.0.1", "done")`` pairs as Step-like rows, in recording order."""
    return [
        SimpleNamespace(id=pk, step_id=step_id, name=f"app.steps.s{pk}", status=status)
        for pk, (step_id, status) in enumerate(specs, start=1)
    ]


def flatten(nodes):
    for node in nodes:
        yield node
        yield from flatten(node.children)


def shape(tree):
    return [(node.path, node.kind, node.status) for node in flatten(tree.roots)]


def test_forks_branches_and_steps_alternate_by_depth():
    tree = build_tree(rows(("1", "done"), ("2.0.1", "done"), ("2.1.1.0.1", "failed")), "failed")
    assert shape(tree) == [
        ("1", "step", "done"),
        ("2", "fork", ""),
        ("2.0", "branch", ""),
        ("2.0.1", "step", "done"),
        ("2.1", "branch", ""),
        ("2.1.1", "fork", ""),
        ("2.1.1.0", "branch", ""),
        ("2.1.1.0.1", "step", "failed"),
    ]
    assert tree.counts == {"done": 2, "failed": 1}


def test_numbered_siblings_sort_numerically_named_ones_keep_their_place():
    tree = build_tree(
        rows(("10", "done"), ("charge", "done"), ("2", "done"), ("1", "done"), ("notify", "done")),
        "completed",
    )
    assert [node.path for node in tree.roots] == ["1", "charge", "2", "10", "notify"]


def test_branches_sort_numerically_even_when_recorded_out_of_order():
    tree = build_tree(rows(("3.10.1", "done"), ("3.2.1", "done"), ("3.0.1", "done")), "running")
    assert [branch.key for branch in tree.roots[0].children] == ["0", "2", "10"]


def test_started_rows_are_in_flight_while_running_and_uncertain_after():
    assert shape(build_tree(rows(("1", "started")), "running")) == [("1", "step", "in_flight")]
    assert shape(build_tree(rows(("1", "started")), "blocked")) == [("1", "step", "uncertain")]


def test_intended_steps_add_pending_nodes_without_hiding_recorded_ones():
    intended = [("1", "app.a"), ("2.0.1", "app.b"), ("2.1.1", "app.c"), ("3", "app.d")]
    tree = build_tree(rows(("1", "done"), ("2.1.1", "done")), "running", intended)
    assert shape(tree) == [
        ("1", "step", "done"),
        ("2", "fork", ""),
        ("2.0", "branch", ""),
        ("2.0.1", "step", "pending"),
        ("2.1", "branch", ""),
        ("2.1.1", "step", "done"),
        ("3", "step", "pending"),
    ]
    pending = [node for node in flatten(tree.roots) if node.status == "pending"]
    assert [(node.name, node.step_pk) for node in pending] == [("app.b", None), ("app.d", None)]
    assert tree.counts == {"done": 2, "pending": 2}


def test_no_steps_make_an_empty_tree():
    tree = build_tree([], "scheduled")
    assert tree.roots == [] and tree.counts == {}


# The steps executing now, as the claimer's heartbeat reported them


def test_an_executing_step_is_marked_distinct_from_the_pending_ones():
    intended = [("1", "app.a"), ("2.0.1", "app.b"), ("2.1.1", "app.c"), ("3", "app.d")]
    tree = build_tree(rows(("1", "done")), "running", intended, executing=["2.0.1", "2.1.1"])
    assert shape(tree) == [
        ("1", "step", "done"),
        ("2", "fork", ""),
        ("2.0", "branch", ""),
        ("2.0.1", "step", "executing"),
        ("2.1", "branch", ""),
        ("2.1.1", "step", "executing"),
        ("3", "step", "pending"),
    ]
    assert tree.counts == {"done": 1, "executing": 2, "pending": 1}
    assert [n.status_label for n in flatten(tree.roots) if n.status == "executing"] == ["running now"] * 2


def test_a_recorded_outcome_wins_over_a_report_that_predates_it():
    tree = build_tree(rows(("1", "done"), ("2", "failed")), "running", executing=["1", "2"])
    assert shape(tree) == [("1", "step", "done"), ("2", "step", "failed")]
    assert tree.counts == {"done": 1, "failed": 1}


def test_an_unsafe_step_in_flight_that_executes_is_marked_executing():
    tree = build_tree(rows(("1", "started")), "running", executing=["1"])
    assert shape(tree) == [("1", "step", "executing")]
    assert tree.counts == {"executing": 1}


def test_an_executing_step_the_analysis_did_not_foresee_still_shows():
    tree = build_tree(rows(("1", "done")), "running", executing=["loop.0.7"])
    assert shape(tree) == [
        ("1", "step", "done"),
        ("loop", "fork", ""),
        ("loop.0", "branch", ""),
        ("loop.0.7", "step", "executing"),
    ]
    assert [n.name for n in flatten(tree.roots)][-1] == ""  # unknown until recorded
