"""A migrated database holds a schedule row for every background job, at its default interval.

The rows come from frozen migrations (0005 and any later one), never from the
live job list, so a job added to ``BEAT_JOBS`` without a migration leaves
databases without its row; this test catches that.
"""

from __future__ import annotations

import json

import pytest
from django_celery_beat.models import PeriodicTask

from meshnet_site.environment import BEAT_JOBS

pytestmark = pytest.mark.django_db


def test_every_background_job_has_a_schedule_row_after_migrate() -> None:
    names = set(PeriodicTask.objects.values_list("name", flat=True))

    assert {job.name for job in BEAT_JOBS} <= names


def test_schedule_rows_carry_the_jobs_task_kwargs_and_default_interval() -> None:
    for job in BEAT_JOBS:
        row = PeriodicTask.objects.select_related("interval").get(name=job.name)

        assert row.task == job.task
        assert json.loads(row.kwargs) == dict(job.kwargs or {})
        assert row.interval is not None
        assert (row.interval.every, row.interval.period) == (job.seconds({}), "seconds")
