"""``runnode --layers auto`` against a real tracker: the node asks where to serve, says why,
and the network routes through it (ADR-0019)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.schema_checks import assert_conforms, live_schema
from tests.support.network import start_network
from tests.support.routing_processes import PROMPT, SETTINGS, TINY
from tracker_app.localnet import (
    ManagedProcess,
    NodeProcess,
    free_port,
    fresh_process_database,
    manage_argv,
    process_env,
)

network = contextmanager(start_network)


def auto_node(
    tracker: str, workdir: Path, env: Mapping[str, str], name: str, *flags: str
) -> NodeProcess:
    """``runnode`` without ``--layers`` joining ``tracker`` (one torch thread); its
    ``layers`` are unknown until it says them."""
    port = free_port()
    argv = manage_argv(
        "runnode", "--model", TINY, "--port", str(port), "--threads", "1",
        "--tracker", tracker, "--wallet-key", str(workdir / f"wallet-{name}.key"), *flags,
    )  # fmt: skip
    process = ManagedProcess(f"node-{name}", argv, env=env, log_path=workdir / f"node-{name}.log")
    return NodeProcess(name, TINY, (-1, -1), f"http://127.0.0.1:{port}", process)


def test_a_node_without_layers_takes_the_uncovered_tail_and_a_chat_runs_through_it(
    tmp_path: Path,
) -> None:
    with (
        fresh_process_database() as database_url,
        network(database_url, tmp_path, REDIS_URL=None, **SETTINGS) as net,
    ):
        head = net.add_node("head", TINY, (0, 1))
        tail = auto_node(net.url, net.workdir, net.env, "auto")
        try:
            tail.wait_serving()
            ready = re.search(r"^node \S+ serving .*$", tail.output(), re.MULTILINE)
            assert ready is not None
            assert f"serving {TINY} layers 2-3 at {tail.endpoint}" in ready.group(0)
            assert "placed by the tracker: layers 2-3 are served by no node; " in ready.group(0)
            assert " holds 4 of 4 layers (" in ready.group(0)

            net.wait_for_route(TINY)
            response = net.chat(model=TINY, messages=PROMPT, max_tokens=8, temperature=0)
            assert response.status_code == 200, response.text
            answer = response.json()
            assert answer["usage"]["completion_tokens"] == 8
            hops = [
                (h["node_id"], h["start_layer"], h["end_layer"]) for h in answer["meshnet"]["hops"]
            ]
            assert hops == [(head.node_id, 0, 1), (tail.node_id, 2, 3)]

            # The plan: two stages of one node each; a next node would join the weaker one.
            plan = httpx.get(
                f"{net.url}/v1/placement", params={"model": TINY}, headers=net.headers(), timeout=30
            )
            assert_conforms(live_schema(net.url), "GET", "/v1/placement", plan)
            body = plan.json()
            assert [(s["start_layer"], s["end_layer"], s["node_ids"]) for s in body["stages"]] == [
                (0, 1, [head.node_id]),
                (2, 3, [tail.node_id]),
            ]
            assert body["uncovered"] == []
            assert all(stage["capacity_tps"] > 0 for stage in body["stages"])
            assert body["offer"]["rule"] == "least_capacity"
        finally:
            tail.stop()


def test_a_node_whose_memory_holds_no_layer_is_refused_before_it_asks_or_loads(
    tmp_path: Path,
) -> None:
    # Nothing listens at the tracker URL: the node counts its memory before it asks.
    unreachable = f"http://127.0.0.1:{free_port()}"
    small = auto_node(unreachable, tmp_path, process_env(), "small", "--memory-gb", "0.0001")
    try:
        assert small.process.wait(timeout=120) != 0
        output = small.output()
        assert "memory holds no whole layer of tiny-random-llama: 0.1 MiB holds 0 of 4" in output
        assert "--memory-gb" in output
        assert "unreachable" not in output and "serving" not in output
    finally:
        small.stop()
