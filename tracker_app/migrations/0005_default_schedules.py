"""The background jobs' default schedules, in django-celery-beat's tables (ADR-0007).

Each job's interval comes from its setting's definition in
``meshnet_site.environment`` (the environment at migrate time, else the
default). Afterwards an operator edits them in the admin; a job that already
has a row (edited, or created by an earlier run) is left as it is.
"""

import json
import os

from django.db import migrations
from django.utils import timezone

from meshnet_site.environment import BEAT_JOBS


def create_schedules(apps, schema_editor):
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTasks = apps.get_model("django_celery_beat", "PeriodicTasks")
    for job in BEAT_JOBS:
        if PeriodicTask.objects.filter(name=job.name).exists():
            continue
        interval, _ = IntervalSchedule.objects.get_or_create(
            every=job.seconds(os.environ), period="seconds"
        )
        PeriodicTask.objects.create(
            name=job.name,
            task=job.task,
            interval=interval,
            kwargs=json.dumps(dict(job.kwargs or {})),
            description=f"default schedule; setting {job.interval.name} pins it at worker start",
        )
    # Tells a running beat to reload its schedule.
    PeriodicTasks.objects.update_or_create(ident=1, defaults={"last_update": timezone.now()})


def remove_schedules(apps, schema_editor):
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    PeriodicTask.objects.filter(name__in=[job.name for job in BEAT_JOBS]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("tracker_app", "0004_audits_and_refunds"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create_schedules, remove_schedules)]
