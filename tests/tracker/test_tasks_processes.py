"""The background jobs through a real Celery worker on Redis, over a real tiny network.

One network: a full node, a node that corrupts its hidden states (the
test-only runtime option) and an honest head computing in bfloat16 in front
of the float32 full node. Requests are served and billed through the corrupt
route before any worker runs; then the worker starts, probes the routes,
quarantines the corrupt one and refunds its charges, while several audits
race over the same records; the mixed-precision route passes the same probe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import Celery

from routing_app.exclusions.probe_verdicts import PROBE_TIE_MARGIN
from tests.support.network import Network, start_network
from tests.support.redis_db import private_redis
from tracker_app.localnet import ManagedProcess, fresh_process_database, wait_until

TINY = "tiny-random-llama"
PROMPT = [{"role": "user", "content": "Tell me about the sea."}]
CORRUPT_ROUTE = 4
FAILED_CHARGED = 4


def routing_status(network: Network, signature: str) -> str | None:
    table = httpx.get(
        f"{network.url}/v1/routing", params={"model": TINY}, headers=network.headers(), timeout=30
    ).json()
    for route in table["models"][0]["routes"]:
        if route["signature"] == signature:
            return str(route["status"])
    return None


@pytest.fixture(scope="module")
def network(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> Iterator[tuple[Network, str]]:
    tmp: Path = tmp_path_factory.mktemp("jobs-worker")
    broker = private_redis(redis_url)
    with fresh_process_database() as database_url:
        for network in start_network(
            database_url, tmp, REDIS_URL=broker, MESHNET_RATE_LIMIT_PER_MINUTE="1000"
        ):
            network.add_node("full", TINY, (0, 3), wait=False)
            network.add_node(
                "corrupt", TINY, (0, 1), extra=["--corrupt-hidden-states", "5"], wait=False
            )
            network.add_node("bf16", TINY, (0, 1), extra=["--dtype", "bfloat16"], wait=False)
            network.wait_for_route(TINY)
            yield network, broker


@pytest.fixture(scope="module")
def worker(network: tuple[Network, str]) -> Callable[[], ManagedProcess]:
    """Starts the network's one Celery worker when a test first asks for it."""
    started: list[ManagedProcess] = []

    def start() -> ManagedProcess:
        if not started:
            started.append(network[0].start_worker("--concurrency", "4"))
        return started[0]

    return start


def test_a_corrupt_node_is_quarantined_and_its_routes_charges_refunded_once_by_racing_audits(
    network: tuple[Network, str], worker: Callable[[], ManagedProcess]
) -> None:
    net, broker = network
    full, corrupt = net.nodes["full"], net.nodes["corrupt"]
    corrupt_signature = f"{TINY} | {corrupt.node_id}[0-1] -> {full.node_id}[2-3]"
    for _ in range(CORRUPT_ROUTE):
        reply = net.chat(
            model=TINY, messages=PROMPT, max_tokens=12, route=[corrupt.node_id, full.node_id]
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["meshnet"]["route"] == corrupt_signature
    for _ in range(FAILED_CHARGED):
        assert net.chat(model=TINY, messages=PROMPT, max_tokens=12, route=[full.node_id]).is_success
    # A bug that charged failed requests, for the audit to find and refund.
    charged = [
        str(row[0])
        for row in net.query(
            "SELECT id FROM tracker_app_chatrequest WHERE route_signature = %s",
            f"{TINY} | {full.node_id}[0-3]",
        )
    ]
    assert len(charged) == FAILED_CHARGED
    for request_id in charged:
        net.query("UPDATE tracker_app_chatrequest SET status = 'failed' WHERE id = %s", request_id)
    assert routing_status(net, corrupt_signature) != "quarantined"

    jobs = worker()
    # Several audits at once, on top of the worker's own scheduled one.
    client = Celery(broker=broker)
    for _ in range(4):
        client.send_task("billing.audit")

    def quarantined() -> bool:
        return routing_status(net, corrupt_signature) == "quarantined"

    wait_until(quarantined, timeout=120, what="the probe to quarantine the route", process=jobs)
    [(suspects,)] = net.query(
        "SELECT suspects FROM routing_app_routequarantine WHERE signature = %s", corrupt_signature
    )
    assert corrupt.node_id in str(suspects) and full.node_id not in str(suspects)
    [(reputation,)] = net.query(
        "SELECT reputation FROM nodes_app_node WHERE id = %s", corrupt.node_id
    )
    assert reputation < 1.0

    def refunds() -> dict[str, int]:
        rows = net.query("SELECT reason, COUNT(*) FROM tracker_app_refund GROUP BY reason")
        return {str(reason): int(count) for reason, count in rows}

    expected = {"corrupt_route": CORRUPT_ROUTE, "charged_failure": FAILED_CHARGED}
    wait_until(lambda: refunds() == expected, timeout=120, what=f"refunds {expected}")
    wait_until(
        lambda: not net.query("SELECT id FROM tracker_app_auditrun WHERE status = 'running'"),
        timeout=60,
        what="every audit to finish",
    )
    runs: list[Any] = net.query("SELECT status, refunds FROM tracker_app_auditrun")
    assert len(runs) >= 5
    assert {status for status, _ in runs} == {"completed"}
    # Each bill refunded once: the runs' own counts add up to the refunds made.
    assert sum(count for _, count in runs) == CORRUPT_ROUTE + FAILED_CHARGED
    bills = net.query(
        "SELECT b.charge, r.amount FROM tracker_app_refund r "
        "JOIN tracker_app_billingrecord b ON b.id = r.billing_id"
    )
    assert all(Decimal(str(amount)) == Decimal(str(charge)) > 0 for charge, amount in bills)
    jobs.check_alive()
    assert "routing.probe_routes" in jobs.output()


def test_an_honest_route_mixing_precisions_passes_the_probe_that_quarantines_a_corrupt_one(
    network: tuple[Network, str], worker: Callable[[], ManagedProcess]
) -> None:
    net, _ = network
    full, bf16 = net.nodes["full"], net.nodes["bf16"]
    mixed = f"{TINY} | {bf16.node_id}[0-1] -> {full.node_id}[2-3]"
    jobs = worker()

    def probed() -> list[Any]:
        return net.query(
            "SELECT outcome, tie_gap FROM routing_app_routeprobe WHERE signature = %s", mixed
        )

    wait_until(lambda: bool(probed()), timeout=120, what="a probe of the route", process=jobs)
    assert {outcome for outcome, _ in probed()} <= {"agreed", "reference"}
    assert all(gap is None or gap <= PROBE_TIE_MARGIN for _, gap in probed())
    assert routing_status(net, mixed) != "quarantined"
    [(reputation,)] = net.query("SELECT reputation FROM nodes_app_node WHERE id = %s", bf16.node_id)
    assert reputation == 1.0
