"""Parents and children under real worker threads: each child's end races
its parent's suspension (the child is claimable as soon as it is inserted),
on two workers at once; no wake-up is lost, no child starts twice, and the
lock order (the parent's row first) leaves no deadlock."""

import pytest

from everystep.api import schedule
from everystep.models import ChildRun, Wait, Workflow
from tests.core import child_workflows as cw
from tests.worker.support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_parents_waiting_for_children_on_two_workers_all_get_their_results(start_worker):
    parents = [schedule(cw.parent_of, "ok", n) for n in range(16)]
    failing = [schedule(cw.parent_of, "fails", f"bad {n}") for n in range(4)]
    everyone = parents + failing
    start_worker(name="a", pool_size=3)
    start_worker(name="b", pool_size=3)

    def ended():
        return Workflow.objects.filter(id__in=[run.id for run in everyone], status="completed").count()

    wait_for(lambda: ended() == len(everyone), what="every parent to get its child's end")
    for n, parent in enumerate(parents):
        [link] = ChildRun.objects.filter(parent_id=parent.id)
        expected = {"value": f"child:{n}", "child": str(link.child_id)}
        assert Workflow.objects.get(id=parent.id).result == expected
    for n, parent in enumerate(failing):
        result = Workflow.objects.get(id=parent.id).result
        assert (result["raised"], result["error"]["message"]) == ("ChildFailed", f"bad {n}")
    assert ChildRun.objects.count() == Workflow.objects.filter(parent_link__isnull=False).count() == 20
    assert not Wait.objects.exists()
