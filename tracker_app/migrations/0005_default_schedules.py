"""The background jobs' default schedules, in django-celery-beat's tables (ADR-0007).

The job list and default intervals are frozen here, as they stood when this
migration was written: a migration is history and must not read the
environment or import application code that may change later. A job added to
``meshnet_site.environment.BEAT_JOBS`` afterwards gets its row from a new
migration. An interval set in the environment is not applied here: the worker
writes it over the row at start (``beat_schedule_pins`` in settings).

This file was edited in place (it used to import ``BEAT_JOBS`` and read
``os.environ``). Databases that already ran it are in the same state either
way: the rows carry the same names, tasks, kwargs and default intervals, and
an environment override was, and still is, written over the row at worker
start. Afterwards an operator edits the rows in the admin; a job that already
has a row is left as it is.
"""

import json

from django.db import migrations
from django.utils import timezone

# (schedule entry name, Celery task, kwargs, default interval in seconds, setting that pins it)
JOBS = (
    ("nodes-sweep-stale", "nodes.sweep_stale", {}, 10, "MESHNET_NODE_SWEEP_INTERVAL"),
    (
        "requests-fail-abandoned",
        "requests.fail_abandoned",
        {},
        600,
        "MESHNET_ABANDONED_SWEEP_INTERVAL",
    ),
    ("routing-prune-arms", "routing.prune_arms", {}, 3600, "MESHNET_ROUTE_PRUNE_INTERVAL"),
    ("routing-probe-routes", "routing.probe_routes", {}, 300, "MESHNET_ROUTE_PROBE_INTERVAL"),
    (
        "routing-reprobe-quarantined",
        "routing.probe_routes",
        {"due_only": True},
        60,
        "MESHNET_ROUTE_REPROBE_INTERVAL",
    ),
    ("billing-audit", "billing.audit", {}, 3600, "MESHNET_AUDIT_INTERVAL"),
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
        ("tracker_app", "0004_audits_and_refunds"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create_schedules, remove_schedules)]
