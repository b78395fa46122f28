import subprocess
import sys
import threading

import pytest
from django.db import transaction

from everystep import database
from everystep.api import schedule
from everystep.errors import EverystepError
from everystep.models import Workflow
from tests.core import workflows as w


@pytest.mark.django_db
def test_schedule_inserts_a_scheduled_run_with_its_arguments():
    run = schedule(w.sequential, 3)
    row = Workflow.objects.get(id=run.id)
    assert (row.name, row.args, row.status) == ("tests.core.workflows.sequential", [3], "scheduled")
    assert row.id.version == 7
    assert row.idempotency_key is None


@pytest.mark.django_db
def test_schedule_refuses_a_plain_function_and_writes_nothing():
    with pytest.raises(TypeError, match="needs a @workflow"):
        schedule(print, 1)
    with pytest.raises(TypeError, match="needs a @workflow"):
        schedule(w.record, "a")  # a step is not a workflow
    assert not Workflow.objects.exists()


@pytest.mark.django_db
def test_schedule_refuses_unserializable_or_ill_fitting_arguments():
    with pytest.raises(EverystepError, match="not serializable"):
        schedule(w.sequential, object())
    with pytest.raises(TypeError, match="arguments do not fit"):
        schedule(w.sequential, 1, 2)
    assert not Workflow.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_schedule_is_rolled_back_with_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic(using=database.alias()):
        schedule(w.sequential, 1)
        raise RuntimeError("the caller's view failed")
    assert not Workflow.objects.exists()


@pytest.mark.django_db
def test_idempotency_key_returns_the_existing_run():
    first = schedule(w.sequential, 1, idempotency_key="order-42")
    second = schedule(w.sequential, 2, idempotency_key="order-42")
    assert second.id == first.id and second.args == [1]
    other = schedule(w.three_steps, idempotency_key="order-42")  # keys are per workflow
    assert other.id != first.id
    assert Workflow.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_idempotency_key_under_concurrency_yields_one_run_and_healthy_transactions():
    callers = 6
    # SQLite's BEGIN IMMEDIATE already serializes the callers: no barrier inside there
    barrier = threading.Barrier(callers if database.connection().vendor != "sqlite" else 1, timeout=30)
    ids, errors = [], []

    def caller():
        try:
            with transaction.atomic(using=database.alias()):
                barrier.wait()
                run = schedule(w.sequential, 1, idempotency_key="race")
                # the caller's transaction is still usable after losing the race
                Workflow.objects.filter(id=run.id).exists()
            ids.append(run.id)
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            database.connection().close()

    threads = [threading.Thread(target=caller) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(ids) == callers and len(set(ids)) == 1
    assert Workflow.objects.filter(idempotency_key="race").count() == 1


def test_importing_everystep_imports_no_models():
    code = (
        "import sys, everystep\n"
        "from everystep import database, step, workflow, parallel, schedule, Terminal\n"
        "from everystep import context, serde, errors\n"
        "assert 'everystep.models' not in sys.modules, 'models imported'\n"
        "assert 'django.apps' not in sys.modules or True\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
