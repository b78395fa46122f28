from django.db import migrations, models


def mysql_equivalents(apps, schema_editor):
    """MySQL/MariaDB have no partial indexes; Django skips the two partial ones there.

    A plain unique index on (name, idempotency_key) is equivalent, because rows
    whose key is NULL never collide in a MySQL unique index; and (status,
    created_at) serves the claim query.
    """
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "CREATE UNIQUE INDEX everystep_workflow_idempotency_my "
        "ON everystep_workflow (name, idempotency_key)"
    )
    schema_editor.execute(
        "CREATE INDEX everystep_workflow_claim_my ON everystep_workflow (status, created_at)"
    )


def drop_mysql_equivalents(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute("DROP INDEX everystep_workflow_idempotency_my ON everystep_workflow")
    schema_editor.execute("DROP INDEX everystep_workflow_claim_my ON everystep_workflow")


class Migration(migrations.Migration):
    """Operator permissions, and a partial index serving the claim query."""

    atomic = False  # MySQL cannot run DDL inside a transaction

    dependencies = [("everystep", "0005_blocked_and_started")]

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
                ],
            },
        ),
        migrations.AddIndex(
            model_name="workflow",
            index=models.Index(
                condition=models.Q(("status", "scheduled")),
                fields=["created_at"],
                name="everystep_workflow_claim_idx",
            ),
        ),
        migrations.RunPython(mysql_equivalents, drop_mysql_equivalents, elidable=False),
    ]
