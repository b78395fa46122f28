from django.db import migrations, models


def args_gin_index(apps, schema_editor):
    """JSON containment on args (the UI's argument filter) uses a GIN index on PostgreSQL."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "CREATE INDEX IF NOT EXISTS everystep_workflow_args_gin "
            "ON everystep_workflow USING gin (args jsonb_path_ops)"
        )


def drop_args_gin_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS everystep_workflow_args_gin")


class Migration(migrations.Migration):
    """Indexes behind every filter of the runs list."""

    dependencies = [("everystep", "0006_permissions_and_claim_index")]

    operations = [
        migrations.AddIndex(
            model_name="workflow",
            index=models.Index(fields=["name", "-created_at"], name="everystep_workflow_name_idx"),
        ),
        migrations.AddIndex(
            model_name="workflow",
            index=models.Index(fields=["claimed_by"], name="everystep_workflow_claimer_idx"),
        ),
        migrations.AddIndex(
            model_name="workflow",
            index=models.Index(fields=["idempotency_key"], name="everystep_workflow_idem_idx"),
        ),
        migrations.RunPython(args_gin_index, drop_args_gin_index),
    ]
