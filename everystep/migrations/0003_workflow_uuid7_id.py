import uuid6
from django.db import migrations, models


class Migration(migrations.Migration):
    """Time-ordered UUIDv7 ids: insertion order and id order agree."""

    dependencies = [("everystep", "0002_remove_workflow_claimed_at")]

    operations = [
        migrations.AlterField(
            model_name="workflow",
            name="id",
            field=models.UUIDField(
                default=uuid6.uuid7, editable=False, primary_key=True, serialize=False
            ),
        )
    ]
