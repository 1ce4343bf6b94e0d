"""Nodes that cheat only where the fixed probe cannot see, caught on what they served.

One real network of the tiny model: an honest head (0-1), an honest whole
node, and three nodes built from the project's own node code with a twist
(tests/support/disguised_node.py): a tail (2-3) honest only for the fixed
probe's fingerprint, a tail honest for the first 12 tokens of every answer,
and a whole node whose head ignores the client's stop sequences. All of them
pass the fixed probe. A real Celery worker on Redis runs the probe task,
which re-runs the requests they served on other routes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import Celery

from tests.support.disguised_node import add_disguised_node
from tests.support.network import Network, start_network
from tests.support.redis_db import private_redis
from tracker_app.localnet import ManagedProcess, fresh_process_database, wait_until

TINY = "tiny-random-llama"
PROMPT = [{"role": "user", "content": "Tell me about the sea."}]
SERVED = 3


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Network]:
    tmp: Path = tmp_path_factory.mktemp("served-probes")
    broker = private_redis(redis_url)
    with fresh_process_database() as database_url:
        for network in start_network(
            database_url,
            tmp,
            REDIS_URL=broker,
            MESHNET_RATE_LIMIT_PER_MINUTE="1000",
            # Probe runs only when a test sends the task (and on topology changes).
            MESHNET_ROUTE_PROBE_INTERVAL="3600",
            MESHNET_ROUTE_REPROBE_INTERVAL="3600",
            MESHNET_PROBE_SAMPLE_CHECKS="8",
        ):
            network.add_node("head", TINY, (0, 1), wait=False)
            network.add_node("full", TINY, (0, 3), wait=False)
            add_disguised_node(network, "probe-honest", TINY, (2, 3), "fixed-probe")
            add_disguised_node(network, "twelve-honest", TINY, (2, 3), "first-12")
            add_disguised_node(network, "deaf", TINY, (0, 3), "ignore-stops")
            network.wait_for_route(TINY)
            yield network


@pytest.fixture(scope="module")
def worker(network: Network) -> Callable[[], ManagedProcess]:
    """Starts the network's Celery worker when a test first asks for it."""
    started: list[ManagedProcess] = []

    def start() -> ManagedProcess:
        if not started:
            started.append(network.start_worker("--concurrency", "2"))
        return started[0]

    return start


def signature(network: Network, *names: str) -> str:
    """The route through the named nodes, each over its own layers."""
    nodes = [network.nodes[name] for name in names]
    hops = " -> ".join(f"{n.node_id}[{n.layers[0]}-{n.layers[1]}]" for n in nodes)
    return f"{TINY} | {hops}"


def chat(network: Network, *names: str, **body: Any) -> dict[str, Any]:
    route = [network.nodes[name].node_id for name in names]
    reply = network.chat(model=TINY, messages=PROMPT, temperature=0, route=route, **body)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def quarantine(network: Network, route: str) -> list[Any]:
    """The route's active quarantine: its suspects, or [] when it is not quarantined."""
    rows = network.query(
        "SELECT suspects FROM routing_app_routequarantine "
        "WHERE signature = %s AND released_at IS NULL",
        route,
    )
    return [str(suspects) for (suspects,) in rows]


def reputation(network: Network, name: str) -> float:
    [(value,)] = network.query(
        "SELECT reputation FROM nodes_app_node WHERE id = %s", network.nodes[name].node_id
    )
    return float(value)


def probe_now(network: Network, worker: Callable[[], ManagedProcess], route: str) -> None:
    """Run the probe task until ``route`` is quarantined (the worker also probes on its
    own after topology changes)."""
    jobs = worker()
    client = Celery(broker=network.env["REDIS_URL"])
    client.send_task("routing.probe_routes", kwargs={"model_key": TINY})
    wait_until(
        lambda: bool(quarantine(network, route)),
        timeout=180,
        what=f"the probe to quarantine {route}",
        process=jobs,
    )


def test_a_tail_honest_only_for_the_fixed_probe_is_caught_on_what_it_served_and_refunded(
    network: Network, worker: Callable[[], ManagedProcess]
) -> None:
    route = signature(network, "head", "probe-honest")
    honest = chat(network, "head", "full", max_tokens=16)["choices"][0]["message"]["content"]
    served = [chat(network, "head", "probe-honest", max_tokens=16) for _ in range(SERVED)]
    assert all(reply["meshnet"]["route"] == route for reply in served)
    assert {reply["choices"][0]["message"]["content"] for reply in served} != {honest}

    probe_now(network, worker, route)

    [suspects] = quarantine(network, route)
    assert network.nodes["probe-honest"].node_id in suspects
    assert network.nodes["head"].node_id not in suspects
    assert reputation(network, "probe-honest") < 1.0
    ids = [reply["id"].removeprefix("chatcmpl-") for reply in served]

    def refunded() -> int:
        rows = network.query(
            "SELECT b.request_id FROM tracker_app_refund r "
            "JOIN tracker_app_billingrecord b ON b.id = r.billing_id "
            "WHERE r.reason = 'corrupt_route'"
        )
        return len({str(request_id).replace("-", "") for (request_id,) in rows} & set(ids))

    wait_until(lambda: refunded() == SERVED, timeout=120, what="the served requests refunded")


def test_a_tail_honest_for_the_first_twelve_tokens_only_is_caught(
    network: Network, worker: Callable[[], ManagedProcess]
) -> None:
    route = signature(network, "head", "twelve-honest")
    reply = chat(network, "head", "twelve-honest", max_tokens=24)
    assert reply["meshnet"]["route"] == route

    probe_now(network, worker, route)

    [suspects] = quarantine(network, route)
    assert network.nodes["twelve-honest"].node_id in suspects
    assert network.nodes["head"].node_id not in suspects
    assert reputation(network, "twelve-honest") < 1.0


def test_the_honest_head_keeps_its_standing_when_its_tails_are_caught(
    network: Network, worker: Callable[[], ManagedProcess]
) -> None:
    for tail in ("probe-honest", "twelve-honest"):
        route = signature(network, "head", tail)
        if not quarantine(network, route):
            chat(network, "head", tail, max_tokens=24)
            probe_now(network, worker, route)

    assert reputation(network, "head") == 1.0
    assert reputation(network, "full") == 1.0
    assert not quarantine(network, signature(network, "head", "full"))


def test_a_head_that_ignores_the_clients_stop_sequence_is_cut_there_and_its_route_quarantined(
    network: Network,
) -> None:
    scored = chat(network, "full", max_tokens=8, logprobs=True)
    tokens = [entry["token"] for entry in scored["choices"][0]["logprobs"]["content"]]
    stop = next(token for token in tokens[1:] if token.strip())
    honest = chat(network, "full", max_tokens=8, stop=[stop])

    deaf = chat(network, "deaf", max_tokens=8, stop=[stop])

    text = deaf["choices"][0]["message"]["content"]
    assert stop not in text
    assert text == honest["choices"][0]["message"]["content"]
    assert deaf["choices"][0]["finish_reason"] == "stop"
    assert deaf["usage"]["completion_tokens"] == honest["usage"]["completion_tokens"]
    [suspects] = quarantine(network, signature(network, "deaf"))
    assert network.nodes["deaf"].node_id in suspects

    def listed_quarantined() -> bool:
        table = httpx.get(
            f"{network.url}/v1/routing",
            params={"model": TINY},
            headers=network.headers(),
            timeout=30,
        ).json()
        rows = {r["signature"]: r["status"] for r in table["models"][0]["routes"]}
        return rows.get(signature(network, "deaf")) == "quarantined"

    wait_until(listed_quarantined, timeout=30, what="the tracker to hold the route")
