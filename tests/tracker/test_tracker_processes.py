"""The tracker and worker as real processes: daphne, Celery beat + worker, no torch."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support.network import Tracker, start_worker
from tracker_app.localnet import process_env, query_process_database
from tracker_app.localnet.stand_in_nodes import ChallengeResponder, proven_registration


def node_status(database_url: str, node_id: str) -> str:
    rows = query_process_database(
        database_url, "SELECT status FROM nodes_app_node WHERE id = %s", node_id
    )
    return str(rows[0][0])


def test_the_tracker_serves_health_schema_and_admin(tracker_process: Tracker) -> None:
    health = httpx.get(f"{tracker_process.url}/healthz")
    schema = httpx.get(f"{tracker_process.url}/api/schema/")
    admin = httpx.get(f"{tracker_process.url}/admin/login/")
    metrics = httpx.get(f"{tracker_process.url}/metrics")

    assert health.status_code == 200 and health.json()["database"] == "ok"
    assert schema.status_code == 200 and "/api/nodes/register" in schema.text
    assert admin.status_code == 200 and "Log in" in admin.text
    assert metrics.status_code == 200 and "django_http_requests" in metrics.text


def test_the_tracker_process_never_loads_torch(
    tracker_process: Tracker, responder: ChallengeResponder
) -> None:
    # Exercise the registry so every tracker code path a node touches is loaded.
    httpx.post(f"{tracker_process.url}/api/nodes/register", json=proven_registration(responder))
    httpx.get(f"{tracker_process.url}/api/schema/")

    maps = Path(f"/proc/{tracker_process.process.pid}/maps").read_text()
    assert "libtorch" not in maps


def test_a_node_that_stops_heartbeating_is_swept_offline_by_the_celery_worker(
    tracker_process: Tracker, tmp_path: Path, responder: ChallengeResponder
) -> None:
    registered = httpx.post(
        f"{tracker_process.url}/api/nodes/register", json=proven_registration(responder)
    ).json()
    assert node_status(tracker_process.database_url, registered["node_id"]) == "online"

    worker = start_worker(
        process_env(
            tracker_process.database_url,
            MESHNET_NODE_HEARTBEAT_TIMEOUT="1",
            MESHNET_NODE_SWEEP_INTERVAL="0.5",
        ),
        tmp_path,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if node_status(tracker_process.database_url, registered["node_id"]) == "offline":
                break
            time.sleep(0.5)
        else:
            pytest.fail("the node was not swept offline; worker log:\n" + worker.output())
    finally:
        worker.stop()
    assert "nodes.sweep_stale" in worker.output()
