"""Default schedules of the registry's upkeep jobs (ADR-0008), like tracker_app 0005.

Frozen here as they stood when written: the endpoint re-proof every 300 s
and the pruning of forgotten node rows hourly. A row that already exists is
left alone; an interval set in the worker's environment is written over the
row at worker start (``beat_schedule_pins``).
"""

import json

from django.db import migrations
from django.utils import timezone

# (schedule entry name, Celery task, kwargs, default interval in seconds, setting that pins it)
JOBS = (
    (
        "nodes-reprove-endpoints",
        "nodes.reprove_endpoints",
        {},
        300,
        "MESHNET_NODE_REPROOF_INTERVAL",
    ),
    ("nodes-prune-stale", "nodes.prune_stale", {}, 3600, "MESHNET_NODE_PRUNE_INTERVAL"),
)


def create_schedules(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTasks = apps.get_model("django_celery_beat", "PeriodicTasks")
    for name, task, kwargs, seconds, setting in JOBS:
        if PeriodicTask.objects.filter(name=name).exists():
            continue
        interval, _ = IntervalSchedule.objects.get_or_create(every=seconds, period="seconds")
        PeriodicTask.objects.create(
            name=name,
            task=task,
            interval=interval,
            kwargs=json.dumps(kwargs),
            description=f"default schedule; setting {setting} pins it at worker start",
        )
    # Tells a running beat to reload its schedule.
    PeriodicTasks.objects.update_or_create(ident=1, defaults={"last_update": timezone.now()})


def remove_schedules(apps, schema_editor):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTask.objects.filter(name__in=[name for name, *_ in JOBS]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("nodes_app", "0003_catalogue_rows"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create_schedules, remove_schedules)]
