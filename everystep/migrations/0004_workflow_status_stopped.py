from django.db import migrations, models


class Migration(migrations.Migration):
    """``stopped``: a step raised Terminal."""

    dependencies = [("everystep", "0003_workflow_uuid7_id")]

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
                ],
                db_index=True,
                default="scheduled",
                max_length=16,
            ),
        )
    ]
