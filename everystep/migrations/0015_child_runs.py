import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    """The table that links a child run to the run that started it, the wait
    kind ``child`` (a choice only), and the permissions to wake a waiting run
    and to send it an event (additive: everystep_workflow and everystep_step
    keep their columns)."""

    dependencies = [
        ("everystep", "0014_concurrency_limit"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="workflow",
            options={
                "ordering": ["-id"],
                "permissions": [
                    ("retry_workflow", "Can retry a failed or stopped run"),
                    ("stop_workflow", "Can stop a run"),
                    ("resolve_workflow", "Can resolve a blocked run"),
                    ("requeue_workflow", "Can requeue a running run"),
                    ("rerun_workflow", "Can re-run a run from a step"),
                    ("fork_workflow", "Can fork a run from a step"),
                    ("wake_workflow", "Can wake a waiting run now"),
                    ("send_event_workflow", "Can send an event to a waiting run"),
                ],
                "verbose_name": "run",
                "verbose_name_plural": "runs",
            },
        ),
        migrations.AlterField(
            model_name="wait",
            name="kind",
            field=models.CharField(
                choices=[("time", "Time"), ("event", "Event"), ("child", "Child")], max_length=16
            ),
        ),
        migrations.CreateModel(
            name="ChildRun",
            fields=[
                (
                    "child",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="parent_link",
                        serialize=False,
                        to="everystep.workflow",
                    ),
                ),
                ("step_id", models.CharField(max_length=300)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "parent",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="child_links",
                        to="everystep.workflow",
                    ),
                ),
            ],
            options={
                "db_table": "everystep_child",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("parent", "step_id"), name="everystep_child_parent_step_uniq"
                    )
                ],
            },
        ),
    ]
