# The admin calls a workflow row a run, as every page and message does (no SQL).
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('everystep', '0010_rerun_and_fork'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='workflow',
            options={'ordering': ['-id'], 'permissions': [('retry_workflow', 'Can retry a failed or stopped run'), ('stop_workflow', 'Can stop a run'), ('resolve_workflow', 'Can resolve a blocked run'), ('requeue_workflow', 'Can requeue a running run'), ('rerun_workflow', 'Can re-run a run from a step'), ('fork_workflow', 'Can fork a run from a step')], 'verbose_name': 'run', 'verbose_name_plural': 'runs'},
        ),
    ]
