from django.db import migrations


class Migration(migrations.Migration):
    """The claimer's name, not a timestamp, is the recovery key."""

    dependencies = [("everystep", "0001_initial")]

    operations = [migrations.RemoveField(model_name="workflow", name="claimed_at")]
