from django.db import migrations, models


class Migration(migrations.Migration):
    """``blocked`` runs and ``started`` steps, for unsafe-to-repeat steps (choices only)."""

    dependencies = [("everystep", "0004_workflow_status_stopped")]

    operations = [
        migrations.AlterField(
            model_name="workflow",
            name="status",
            field=models.CharField(
                choices=[
                    ("scheduled", "Scheduled"),
                    ("running", "Running"),
                    ("completed", "Completed"),
                    ("failed", "Failed"),
                    ("stopped", "Stopped"),
                    ("blocked", "Blocked"),
                ],
                db_index=True,
                default="scheduled",
                max_length=16,
            ),
        ),
        migrations.AlterField(
            model_name="step",
            name="status",
            field=models.CharField(
                choices=[("started", "Started"), ("done", "Done"), ("failed", "Failed")],
                max_length=16,
            ),
        ),
    ]
