"""Nodes killed mid-stream (SIGKILL, as a crash), each position of a 3-hop route in turn.

A real tracker, a real Celery worker (its liveness sweep takes a dead node
out of the registry, as in production) and real ``runnode`` processes on the
tiny model: two nodes for each of layers 0-1, 2-2 and 3-3, so every route
has three hops and every position has a spare. Each case kills the node at
its position of the route serving the stream and spends that position's
spare; the last case finds no spare left. The client sees the stream, the
database holds the request, its charge and the work credited to each node.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from tests.support.network import Network, start_network, start_worker
from tests.support.nodes import generate_body, read_stream, start_node
from tests.support.redis_db import private_redis
from tests.support.sse import chunks_of, text_of
from tracker_app.localnet import NodeProcess, fresh_process_database, wait_until

TINY = "tiny-random-llama"
PROMPT = [{"role": "user", "content": "Tell me about meshes."}]
MAX_TOKENS = 300
POSITIONS = ("head", "middle", "tail")
LAYERS = {"head": (0, 1), "middle": (2, 2), "tail": (3, 3)}
SETTINGS = {
    "MESHNET_RATE_LIMIT_PER_MINUTE": "1000",
    # A dead node is offline within about three seconds: heartbeats every
    # second, three missed ones and a sweep every second.
    "MESHNET_NODE_HEARTBEAT_INTERVAL": "1",
    "MESHNET_NODE_HEARTBEAT_TIMEOUT": "3",
    "MESHNET_NODE_SWEEP_INTERVAL": "1",
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node running every layer with no tracker: the answer to compare with.

    Started, not waited for: it loads while the network's nodes do.
    """
    node = start_node(tmp_path_factory.mktemp("reference"), TINY, (0, 3), node_id="reference")
    with node.process:
        yield node


@pytest.fixture(scope="module")
def mesh(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, reference: NodeProcess
) -> Iterator[Network]:
    """Tracker, worker and two nodes per layer range; their Celery queue of their own.

    Asks for ``reference`` only so that it starts first and loads alongside.
    """
    tmp = tmp_path_factory.mktemp("faults-nodes")
    settings = {**SETTINGS, "REDIS_URL": private_redis(redis_url)}
    with fresh_process_database() as database_url:
        for network in start_network(database_url, tmp, **settings):
            for position, layers in LAYERS.items():
                for spare in ("a", "b"):
                    network.add_node(f"{position}-{spare}", TINY, layers, wait=False)
            with start_worker(network.env, tmp):
                network.wait_for_route(TINY)
                yield network


@pytest.fixture(scope="module")
def whole_model_answer(reference: NodeProcess, mesh: Network) -> str:
    """The greedy answer of the whole model on one node, with no tracker in between."""
    reference.wait_serving()
    body = generate_body([(reference, 0, 3)], messages=PROMPT, max_tokens=MAX_TOKENS)
    answer = text_of(read_stream(reference.endpoint, body))
    reference.stop()  # its CPU is the network's from here on
    return answer


def offline_once_swept(mesh: Network, killed: list[NodeProcess]) -> None:
    """Wait until the liveness sweep took every killed node out of the registry."""
    ids = [node.node_id for node in killed]
    wait_until(
        lambda: all(
            mesh.query("SELECT status FROM nodes_app_node WHERE id = %s", node_id) != [("online",)]
            for node_id in ids
        ),
        timeout=30,
        what=f"the sweep to take {ids} offline",
    )


def stream_and_kill(mesh: Network, position: int) -> tuple[list[Any], NodeProcess]:
    """Stream a greedy chat; once content flows, SIGKILL the route's node at ``position``."""
    frames: list[Any] = []
    killed: NodeProcess | None = None
    for frame in mesh.iter_stream(
        model=TINY, messages=PROMPT, max_tokens=MAX_TOKENS, temperature=0
    ):
        frames.append(frame)
        if killed is None and any(
            c["choices"][0]["delta"].get("content") for c in chunks_of(frames)
        ):
            hops = chunks_of(frames)[0]["meshnet"]["hops"]
            assert len(hops) == 3, hops
            node_id = hops[position]["node_id"]
            killed = next(n for n in mesh.nodes.values() if n.node_id == node_id)
            killed.kill()
    assert killed is not None, "the stream ended before any content"
    return frames, killed


def request_id_of(frames: list[Any]) -> uuid.UUID:
    return uuid.UUID(chunks_of(frames)[0]["id"].removeprefix("chatcmpl-"))


@pytest.fixture(scope="module")
def killed_so_far() -> list[NodeProcess]:
    """The nodes the cases of this module killed, in order."""
    return []


@pytest.mark.parametrize("position", POSITIONS)
def test_a_node_killed_mid_stream_is_failed_over_to_the_identical_greedy_answer_billed_once(
    mesh: Network, whole_model_answer: str, killed_so_far: list[NodeProcess], position: str
) -> None:
    offline_once_swept(mesh, killed_so_far)

    frames, killed = stream_and_kill(mesh, POSITIONS.index(position))
    killed_so_far.append(killed)

    assert killed.name.startswith(position)
    assert frames[-1] == "[DONE]"
    assert not [f for f in frames if isinstance(f, dict) and "error" in f]
    assert text_of(frames) == whole_model_answer
    assert chunks_of(frames)[-1]["usage"]["completion_tokens"] == MAX_TOKENS
    request_id = request_id_of(frames)
    [(status, signature)] = mesh.query(
        "SELECT status, route_signature FROM tracker_app_chatrequest WHERE id = %s", request_id
    )
    assert status == "completed"
    assert killed.node_id not in signature
    [(billing_id, charge, fee)] = mesh.query(
        "SELECT id, charge, network_fee FROM tracker_app_billingrecord WHERE request_id = %s",
        request_id,
    )
    units = mesh.query(
        "SELECT node_id, amount FROM tracker_app_workunit WHERE billing_id = %s", billing_id
    )
    first_route = {hop["node_id"] for hop in chunks_of(frames)[0]["meshnet"]["hops"]}
    final_route = {n.node_id for n in mesh.nodes.values() if n.node_id in signature}
    assert {node_id for node_id, _ in units} == first_route | final_route
    assert sum(Decimal(str(amount)) for _, amount in units) == Decimal(str(charge)) - Decimal(
        str(fee)
    )


def test_a_node_killed_mid_stream_with_no_spare_left_ends_the_stream_with_an_error_and_no_charge(
    mesh: Network, whole_model_answer: str, killed_so_far: list[NodeProcess]
) -> None:
    offline_once_swept(mesh, killed_so_far)  # every position's spare is spent

    frames, killed = stream_and_kill(mesh, POSITIONS.index("middle"))

    assert frames[-1] == "[DONE]"
    error = frames[-2]["error"]
    assert set(error) == {"message", "type", "code"}
    assert error["code"] == "no_route" and TINY in error["message"]
    # What was streamed before the failure is the right answer, cut short.
    streamed = text_of(frames)
    assert streamed and whole_model_answer.startswith(streamed)
    assert streamed != whole_model_answer
    request_id = request_id_of(frames)
    assert mesh.query("SELECT status FROM tracker_app_chatrequest WHERE id = %s", request_id) == [
        ("failed",)
    ]
    assert not mesh.query(
        "SELECT id FROM tracker_app_billingrecord WHERE request_id = %s", request_id
    )
    assert killed.name.startswith("middle")
