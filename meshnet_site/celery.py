"""The Celery app: broker and schedule come from Django settings (CELERY_*)."""

import os
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import before_task_publish, celeryd_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "meshnet_site.settings")

app = Celery("meshnet")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@celeryd_init.connect
@before_task_publish.connect
def _make_embedded_broker_folders(**_: Any) -> None:
    """The serverless (filesystem) broker needs its folders before the worker polls them
    and before a task is sent (a tracker queues probes, maybe before any worker started)."""
    options = app.conf.broker_transport_options or {}
    for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        if key in options:
            Path(options[key]).mkdir(parents=True, exist_ok=True)
