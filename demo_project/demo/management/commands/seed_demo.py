from django.core.management.base import BaseCommand

from demo_project.demo import workflows
from everystep import operations, runner, schedule
from everystep.errors import SimulatedCrash
from everystep.models import Workflow


class Command(BaseCommand):
    help = "Schedule a mix of demo runs, including one left blocked by a simulated crash."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=3, help="runs of each kind")

    def handle(self, count, **options):
        base = Workflow.objects.count() * 10 + 1
        for i in range(count):
            order = base + i
            schedule(workflows.sequential_order, order)
            schedule(workflows.fan_out, order)
            schedule(workflows.fraud_checked, order * 5 if i == 0 else order)
            schedule(workflows.inventory_sync, order)
            schedule(workflows.checkout_with_cleanup, order, -1 if i == 0 else 20)
        report = schedule(workflows.nightly_report, 30)
        blocked = self.crash_after_charge(base + count)
        self.stdout.write(
            f"scheduled {5 * count} runs; run {report.id}, a slow report (about a minute) to try "
            f"Stop on; and run {blocked.id} whose worker 'died' right after charging a card: a "
            "worker will park it as blocked"
        )

    def crash_after_charge(self, order):
        """Run a checkout in-process and 'die' between the charge and its record,
        then hand the run back as a crashed worker's runs are handed back."""
        run = schedule(workflows.checkout_with_cleanup, order, 99)
        claimer = "crashed-demo-worker"
        Workflow.objects.filter(id=run.id).update(status=Workflow.Status.RUNNING, claimed_by=claimer)

        def crash(ctx, step_id):
            if step_id == "2":
                raise SimulatedCrash("the demo pulls the plug after the charge")

        runner.fault = crash
        try:
            runner.execute(Workflow.objects.get(id=run.id), claimer)
        finally:
            runner.fault = None
        operations.release_run(run.id, claimer)
        return run
