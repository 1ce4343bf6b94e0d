"""The schedule row of the guards' prune job (django-celery-beat, ADR-0007).

Frozen like tracker_app 0005: name, task and default interval as they stood
when this was written; an interval set in the worker's environment
(MESHNET_GUARDS_PRUNE_INTERVAL) is written over the row at worker start. A
row that already exists (an operator's) is left alone.
"""

import json

from django.db import migrations
from django.utils import timezone

NAME = "guards-prune"
TASK = "guards.prune"
DEFAULT_SECONDS = 600
SETTING = "MESHNET_GUARDS_PRUNE_INTERVAL"


def create_schedule(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTasks = apps.get_model("django_celery_beat", "PeriodicTasks")
    if PeriodicTask.objects.filter(name=NAME).exists():
        return
    interval, _ = IntervalSchedule.objects.get_or_create(every=DEFAULT_SECONDS, period="seconds")
    PeriodicTask.objects.create(
        name=NAME,
        task=TASK,
        interval=interval,
        kwargs=json.dumps({}),
        description=f"default schedule; setting {SETTING} pins it at worker start",
    )
    # Tells a running beat to reload its schedule.
    PeriodicTasks.objects.update_or_create(ident=1, defaults={"last_update": timezone.now()})


def remove_schedule(apps, schema_editor):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTask.objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("guards", "0001_once_claims_and_window_counters"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create_schedule, remove_schedule)]
