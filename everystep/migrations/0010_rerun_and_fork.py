import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    """The permissions to re-run a run from a step and to fork it, and the
    table that links a fork to its origin (additive: everystep_workflow and
    everystep_step keep their columns)."""

    dependencies = [
        ("everystep", "0009_step_workflow_index_dropped"),
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
                ],
            },
        ),
        migrations.CreateModel(
            name="RunFork",
            fields=[
                (
                    "run",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="forked_from",
                        serialize=False,
                        to="everystep.workflow",
                    ),
                ),
                ("origin_step_id", models.CharField(max_length=300)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "origin",
                    models.ForeignKey(
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="forks",
                        to="everystep.workflow",
                    ),
                ),
            ],
            options={
                "db_table": "everystep_run_fork",
                "indexes": [
                    models.Index(fields=["origin", "created_at"], name="everystep_run_fork_origin_idx")
                ],
            },
        ),
    ]
