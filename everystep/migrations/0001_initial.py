import uuid

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

import everystep.fields


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Workflow",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        default=uuid.uuid4, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("name", models.CharField(max_length=300)),
                ("args", everystep.fields.EverystepJSONField(default=list)),
                ("idempotency_key", models.CharField(blank=True, max_length=255, null=True)),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("scheduled", "Scheduled"),
                            ("running", "Running"),
                            ("completed", "Completed"),
                            ("failed", "Failed"),
                        ],
                        db_index=True,
                        default="scheduled",
                        max_length=16,
                    ),
                ),
                ("claimed_by", models.CharField(blank=True, max_length=255, null=True)),
                ("claimed_at", models.DateTimeField(blank=True, null=True)),
                ("result", everystep.fields.EverystepJSONField(blank=True, null=True)),
                ("error", everystep.fields.EverystepJSONField(blank=True, null=True)),
                (
                    "created_at",
                    models.DateTimeField(db_index=True, default=django.utils.timezone.now),
                ),
                ("completed_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={"db_table": "everystep_workflow", "ordering": ["-id"]},
        ),
        migrations.CreateModel(
            name="Step",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("step_id", models.CharField(max_length=300)),
                ("name", models.CharField(max_length=300)),
                ("args", everystep.fields.EverystepJSONField(default=list)),
                ("kwargs", everystep.fields.EverystepJSONField(default=dict)),
                (
                    "status",
                    models.CharField(
                        choices=[("done", "Done"), ("failed", "Failed")], max_length=16
                    ),
                ),
                ("result", everystep.fields.EverystepJSONField(blank=True, null=True)),
                ("error", everystep.fields.EverystepJSONField(blank=True, null=True)),
                (
                    "workflow",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="steps",
                        to="everystep.workflow",
                    ),
                ),
            ],
            options={"db_table": "everystep_step", "ordering": ["id"]},
        ),
        migrations.AddConstraint(
            model_name="workflow",
            constraint=models.UniqueConstraint(
                condition=models.Q(("idempotency_key__isnull", False)),
                fields=("name", "idempotency_key"),
                name="everystep_workflow_idempotency_uniq",
            ),
        ),
        migrations.AddConstraint(
            model_name="step",
            constraint=models.UniqueConstraint(
                fields=("workflow", "step_id"), name="everystep_step_workflow_step_id_uniq"
            ),
        ),
    ]
