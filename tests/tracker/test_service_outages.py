"""The services around the tracker fail and return, one at a time, while nodes serve.

One deployment for every case: a tracker whose PostgreSQL connection runs
through a :class:`FaultyLink` (a TCP relay the test can cut), a Redis of its
own (stopped and started by the test, never the shared one), a real Celery
worker with its beat, and two nodes running the whole tiny model. Each case
breaks one thing, watches what a client sees and what the database holds,
and leaves the deployment whole again for the next.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis

from meshnet_site.guards.models import WindowCounter
from tests.support.fault_link import FaultyLink
from tests.support.network import Network, running_tracker, start_network, start_worker
from tests.support.redis_server import RedisServer
from tests.support.sse import text_of
from tracker_app.api_keys.rate_limit import WINDOW_SECONDS as RATE_WINDOW_SECONDS
from tracker_app.api_keys.services import api_key_hash
from tracker_app.localnet import ManagedProcess, fresh_process_database, wait_until

TINY = "tiny-random-llama"
PROMPT = [{"role": "user", "content": "Tell me about the sea."}]
HEARTBEAT_SECONDS = 1.0
# Process scheduling on a loaded CI machine, on top of one heartbeat interval.
SCHEDULING_SLACK_SECONDS = 2.0
SETTINGS = {
    "MESHNET_RATE_LIMIT_PER_MINUTE": "1000",
    "MESHNET_ROUTE_MIN_SAMPLE_TOKENS": "1",
    "MESHNET_NODE_HEARTBEAT_INTERVAL": str(HEARTBEAT_SECONDS),
}


@dataclass
class Deployment:
    """The network (its tracker behind ``link``), its Redis and its worker."""

    network: Network
    database_url: str  # direct, for the worker, a second tracker and the test's queries
    link: FaultyLink
    redis: RedisServer
    worker: ManagedProcess

    def restart_worker(self) -> None:
        self.worker = direct_worker(self.network, self.database_url)


def direct_worker(network: Network, database_url: str) -> ManagedProcess:
    """The Celery worker and beat, straight on the database (the link is the tracker's)."""
    logs = network.workdir / f"worker-{time.monotonic_ns()}"
    return start_worker({**network.env, "DATABASE_URL": database_url}, logs)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        pytest.fail("these tests cut a PostgreSQL connection: set DATABASE_URL to one")
    tmp = tmp_path_factory.mktemp("faults-services")
    with (
        fresh_process_database() as database_url,
        FaultyLink.to_url(database_url) as link,
        RedisServer(tmp / "redis") as redis_server,
    ):
        settings = {
            **SETTINGS,
            "DATABASE_URL": link.url_for(database_url),
            "REDIS_URL": redis_server.url,
        }
        for network in start_network(database_url, tmp, **settings):
            network.add_node("whole-a", TINY, (0, 3), wait=False)
            network.add_node("whole-b", TINY, (0, 3), wait=False)
            worker = direct_worker(network, database_url)
            deployment = Deployment(network, database_url, link, redis_server, worker)
            try:
                network.wait_for_route(TINY)
                yield deployment
            finally:
                deployment.worker.stop()


def chat(url: str, api_key: str, **extra: Any) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": TINY, "messages": PROMPT, "max_tokens": 12, "temperature": 0, **extra},
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=60,
    )


def served(url: str, api_key: str) -> dict[str, Any]:
    """A completed chat's reply (asserting it completed)."""
    response = chat(url, api_key)
    assert response.status_code == 200, response.text
    return dict(response.json())


def signed_in(network: Network, username: str, password: str) -> httpx.Client:
    """A browser-like client signed in to the dashboard as a staff user."""
    network.create_staff_user(username, password)
    client = httpx.Client(base_url=network.url, timeout=30)
    client.get("/dashboard/login/")
    response = client.post(
        "/dashboard/login/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
    )
    assert response.status_code == 302, response.text
    assert client.get("/dashboard/").status_code == 200
    return client


def committed_rows(network: Network) -> set[tuple[Any, ...]]:
    """Every request, charge and work unit, as the database holds them now."""
    return {
        *network.query(
            "SELECT 'request', id::text, status, completion_tokens::text "
            "FROM tracker_app_chatrequest"
        ),
        *network.query(
            "SELECT 'billing', id::text, request_id::text, charge::text "
            "FROM tracker_app_billingrecord"
        ),
        *network.query(
            "SELECT 'work', id::text, billing_id::text, node_id || ':' || amount::text "
            "FROM tracker_app_workunit"
        ),
    }


def test_a_restarted_tracker_hears_its_nodes_within_a_heartbeat_and_keeps_every_committed_row(
    deployment: Deployment,
) -> None:
    network = deployment.network
    assert network.tracker is not None
    served(network.url, network.api_key)
    before = committed_rows(network)
    node = network.nodes["whole-a"]
    failed_heartbeats = node.output().count("heartbeat failed")

    network.tracker.process.kill()  # a crash: nothing is flushed or said goodbye to
    wait_until(
        lambda: node.output().count("heartbeat failed") > failed_heartbeats,
        timeout=30,
        what="a node to miss the tracker",
    )
    network.start_tracker(port=int(network.url.rsplit(":", 1)[1]))
    [(restarted,)] = network.query("SELECT now()")

    running = [n.node_id for n in network.nodes.values() if n.process.alive()]

    def heard_from_every_node() -> bool:
        beats = network.query(
            "SELECT status, last_heartbeat_at FROM nodes_app_node WHERE id = ANY(%s)", running
        )
        return len(beats) == len(running) and all(
            status == "online" and at > restarted for status, at in beats
        )

    wait_until(
        heard_from_every_node,
        timeout=HEARTBEAT_SECONDS + SCHEDULING_SLACK_SECONDS,
        what="every node's heartbeat to reach the restarted tracker",
    )
    reply = served(network.url, network.api_key)
    after = committed_rows(network)
    assert before < after
    request_id = str(uuid.UUID(reply["id"].removeprefix("chatcmpl-")))
    assert ("request", request_id, "completed", "12") in after - before


def route_samples(url: str, api_key: str) -> int:
    """How many samples the tracker at ``url`` routes on: its own and its peers'."""
    table = httpx.get(
        f"{url}/v1/routing",
        params={"model": TINY},
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=30,
    ).json()
    return sum(int(route["samples"]) for route in table["models"][0]["routes"])


def test_with_redis_stopped_two_trackers_keep_serving_and_merge_their_stats_once_it_returns(
    deployment: Deployment, tmp_path: Path
) -> None:
    network = deployment.network
    assert network.tracker_key_file is not None
    with running_tracker(
        deployment.database_url,
        tmp_path,
        REDIS_URL=deployment.redis.url,
        MESHNET_TRACKER_KEY_FILE=str(network.tracker_key_file),  # one deployment, one key
        **SETTINGS,
    ) as second:
        first = network.url
        # Every sample so far is the first tracker's (the second has just started).
        before = route_samples(first, network.api_key)
        for url in (first, second.url):
            served(url, network.api_key)
        merged: list[int] = []

        def agree() -> bool:
            # Each holding both new samples: its own alone would look agreed too.
            merged[:] = [route_samples(url, network.api_key) for url in (first, second.url)]
            return merged[0] == merged[1] == before + 2

        wait_until(agree, timeout=30, what="both trackers to merge their samples")
        total = merged[0]

        deployment.redis.stop()
        try:
            streamed = network.stream(model=TINY, messages=PROMPT, max_tokens=12, temperature=0)
            served(first, network.api_key)
            served(second.url, network.api_key)
            assert streamed[-1] == "[DONE]" and text_of(streamed)
            # Each tracker counts what it served itself at once; its peer's it cannot learn.
            assert route_samples(first, network.api_key) == total + 2
            assert route_samples(second.url, network.api_key) == total + 1
        finally:
            deployment.redis.start()

        wait_until(
            lambda: all(
                route_samples(url, network.api_key) == total + 3 for url in (first, second.url)
            ),
            timeout=30,
            what="both trackers to merge again",
        )


def queued_jobs(redis_url: str) -> int:
    """Jobs waiting in the Celery queue for a worker."""
    return int(redis.Redis.from_url(redis_url).llen("celery"))


def current_epoch(network: Network) -> int:
    [(epoch,)] = network.query(
        "SELECT MAX(e.number) FROM nodes_app_topologyepoch e "
        "JOIN nodes_app_languagemodel m ON e.model_id = m.id WHERE m.key = %s",
        TINY,
    )
    return int(epoch)


def test_with_the_worker_stopped_requests_are_served_and_the_queued_probe_runs_when_it_returns(
    deployment: Deployment,
) -> None:
    network = deployment.network
    deployment.worker.stop()  # warm shutdown, as an operator's restart would

    network.nodes["whole-b"].stop()  # deregisters: a new topology, whose probe is queued
    epoch = current_epoch(network)
    wait_until(lambda: queued_jobs(deployment.redis.url) > 0, what="the probe to be queued")
    served(network.url, network.api_key)
    assert not network.query("SELECT id FROM routing_app_routeprobe WHERE epoch = %s", epoch)

    deployment.restart_worker()

    wait_until(
        lambda: bool(
            network.query("SELECT id FROM routing_app_routeprobe WHERE epoch = %s", epoch)
        ),
        timeout=60,
        what="the worker to run the probe queued while it was away",
        process=deployment.worker,
    )


def test_with_postgresql_unreachable_clients_get_503s_and_the_tracker_recovers_by_itself(
    deployment: Deployment,
) -> None:
    network = deployment.network
    served(network.url, network.api_key)
    operator = signed_in(network, "outage-operator", "a-long-enough-passphrase")

    with deployment.link.down():
        answers = {
            "chat": chat(network.url, network.api_key),
            "stream": chat(network.url, network.api_key, stream=True),
            "models": httpx.get(f"{network.url}/v1/models", timeout=30),
        }
        health = httpx.get(f"{network.url}/healthz", timeout=30)
        pages = {path: operator.get(path) for path in ("/dashboard/", "/admin/")}

    for name, answer in answers.items():
        assert answer.status_code == 503, (name, answer.text)
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "code"}, name
        assert error["code"] == "database_unavailable", name
        assert "unavailable" in error["message"]
        assert answer.headers["Retry-After"] == "5"
    assert health.status_code == 503
    for path, page in pages.items():  # a page, not Django's 500
        assert page.status_code == 503, (path, page.text)
        assert "database is unavailable" in page.text, path
        assert page.headers["Retry-After"] == "5", path
    # The link is back: no restart. The worker (its own connection) may have swept
    # the nodes whose heartbeats the tracker could not record meanwhile; their next
    # heartbeats, which the tracker now records, bring the route back.
    network.wait_for_route(TINY, timeout=HEARTBEAT_SECONDS + 10)
    reply = served(network.url, network.api_key)
    assert reply["usage"]["completion_tokens"] == 12
    assert httpx.get(f"{network.url}/v1/models", timeout=30).status_code == 200
    assert httpx.get(f"{network.url}/healthz", timeout=30).status_code == 200
    assert operator.get("/dashboard/").status_code == 200
    operator.close()


def test_a_chat_stuck_on_a_database_lock_does_not_hold_up_another_clients_chat(
    deployment: Deployment,
) -> None:
    # A lock held on one API key's rate-limit counter (a slow query, a long
    # transaction elsewhere) must stall that key's chat alone: the tracker's
    # database calls run beside each other, not queued on one shared thread.
    network = deployment.network
    stuck_key, other_key = network.api_key, network.create_api_key("unhindered")
    wait_until(
        lambda: time.time() % RATE_WINDOW_SECONDS < RATE_WINDOW_SECONDS - 20,
        timeout=RATE_WINDOW_SECONDS,
        what="a rate-limit window with time to spare",
    )
    served(network.url, stuck_key)  # its counter for this window exists now
    counter = f"api-key:{api_key_hash(stuck_key)}"
    pool = ThreadPoolExecutor(1)
    with psycopg.connect(deployment.database_url) as holder:
        locked = holder.execute(
            f"SELECT count FROM {WindowCounter._meta.db_table} WHERE key = %s "
            "AND window_start = %s FOR UPDATE",
            [counter, int(time.time()) // RATE_WINDOW_SECONDS * RATE_WINDOW_SECONDS],
        ).fetchall()
        assert len(locked) == 1
        stuck = pool.submit(chat, network.url, stuck_key)
        wait_until(
            lambda: bool(
                network.query(
                    "SELECT 1 FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ),
            timeout=30,
            what="the stuck chat to wait for the lock",
        )

        other = chat(network.url, other_key)

        assert other.status_code == 200, other.text
        assert other.json()["usage"]["completion_tokens"] == 12
        assert not stuck.done()
        holder.rollback()
    assert stuck.result(timeout=60).status_code == 200
    pool.shutdown()
