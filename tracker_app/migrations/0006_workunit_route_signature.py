"""Each work unit records the route it was part of (ADR-0007, the billing audit).

Existing units take their request's ``route_signature``: the last route it
used, which is the only one recorded before this migration.
"""

from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.models import OuterRef, Subquery


def backfill_route_signature(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    ChatRequest = apps.get_model("tracker_app", "ChatRequest")
    WorkUnit = apps.get_model("tracker_app", "WorkUnit")
    WorkUnit.objects.update(
        route_signature=Subquery(
            ChatRequest.objects.filter(billing=OuterRef("billing_id")).values("route_signature")[:1]
        )
    )


class Migration(migrations.Migration):
    dependencies = [
        ("tracker_app", "0005_default_schedules"),
    ]

    operations = [
        migrations.AddField(
            model_name="workunit",
            name="route_signature",
            field=models.CharField(
                blank=True, help_text="The route this hop was part of", max_length=2000
            ),
        ),
        migrations.RunPython(backfill_route_signature, migrations.RunPython.noop),
    ]
