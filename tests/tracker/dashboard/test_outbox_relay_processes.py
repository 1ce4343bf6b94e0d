"""The worker reaches the dashboards in the embedded mode: through the database outbox.

No Redis here: the tracker's channel layer is in-memory, which a worker
process cannot reach. A node the worker's sweep takes offline must still
show on an open dashboard, without a reload.
"""

from __future__ import annotations

import asyncio
import json
from contextlib import contextmanager
from pathlib import Path

import httpx
import websockets

from tests.support.network import Network, start_network
from tracker_app.localnet import fresh_process_database, manage_argv, run_checked
from tracker_app.localnet.stand_in_nodes import ChallengeResponder, proven_registration

network = contextmanager(start_network)


def staff_cookie(net: Network) -> str:
    run_checked(
        manage_argv("createsuperuser", "--noinput", "--username", "staff", "--email", "s@x.org"),
        env={**net.env, "DJANGO_SUPERUSER_PASSWORD": "pw-jobs"},
    )
    with httpx.Client(base_url=net.url) as client:
        page = client.get("/admin/login/")
        token = page.text.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
        client.post(
            "/admin/login/?next=/admin/",
            data={"username": "staff", "password": "pw-jobs", "csrfmiddlewaretoken": token},
        )
        return f"sessionid={client.cookies['sessionid']}"


def test_a_node_the_worker_sweeps_offline_shows_on_an_open_dashboard(
    tmp_path: Path, responder: ChallengeResponder
) -> None:
    settings = {"REDIS_URL": None, "MESHNET_NODE_HEARTBEAT_TIMEOUT": "1"}
    with (
        fresh_process_database() as database_url,
        network(database_url, tmp_path, **settings) as net,
    ):
        registered = httpx.post(
            f"{net.url}/api/nodes/register", json=proven_registration(responder)
        )
        node_id = registered.json()["node_id"]
        cookie = staff_cookie(net)
        ws_url = net.url.replace("http://", "ws://") + "/ws/dashboard/"

        async def watch() -> str:
            async with websockets.connect(
                ws_url, additional_headers={"Cookie": cookie, "Origin": net.url}
            ) as socket:
                await socket.recv()  # the page's first state
                net.env["MESHNET_NODE_SWEEP_INTERVAL"] = "1"
                net.start_worker("--pool", "solo")
                while True:
                    message = json.loads(await asyncio.wait_for(socket.recv(), 90))
                    if message["type"] == "node" and message["node"]["id"] == node_id:
                        return str(message["node"]["status"])

        assert asyncio.run(watch()) == "offline"
        assert net.query("SELECT COUNT(*) FROM outbox_outboxmessage") == [(0,)]
