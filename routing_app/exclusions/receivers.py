"""What routing does when the registry signals a change (connected in ``apps.py``)."""

from __future__ import annotations

import logging
from typing import Any

from meshnet_site.celery import app as celery_app

logger = logging.getLogger(__name__)

PROBE_TASK = "routing.probe_routes"
# A probe queued for a topology that no worker took up within this long
# (none was running) is dropped: the periodic probe covers it by then.
PROBE_EXPIRES_SECONDS = 600


def probe_on_topology_change(sender: Any, *, model_key: str, epoch: int, **_: Any) -> None:
    """Queue a probe of the model's routes under its new epoch (by task name).

    Best effort: a broker that is away costs this probe, never the
    registration, heartbeat or sweep that changed the topology.
    """
    try:
        celery_app.send_task(
            PROBE_TASK,
            kwargs={"model_key": model_key, "epoch": epoch},
            expires=PROBE_EXPIRES_SECONDS,
            retry=False,
            # The sender waits for nothing; the result is the worker's to keep.
            ignore_result=True,
        )
    except Exception:
        logger.warning("could not queue the route probe of %s", model_key, exc_info=True)
