import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    """Drop the index on everystep_step.workflow_id: the unique (workflow_id,
    step_id) index already serves every lookup by run, and each index costs a
    write per recorded step. (MariaDB/MySQL had none of its own: InnoDB uses
    the unique index for the foreign key.)"""

    dependencies = [
        ('everystep', '0008_completed_at_index'),
    ]

    operations = [
        migrations.AlterField(
            model_name='step',
            name='workflow',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='everystep.workflow'),
        ),
    ]
