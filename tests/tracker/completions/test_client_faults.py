"""A client's bad input is the client's 4xx, bans no one, and is never charged.

Against a real tracker and real tiny-model nodes (one route only, so a
banned node would leave the model without a route): sampling that once
crashed a tail, NaN in a chat body, input past a head's caps; past the
tracker, the nodes refuse the same input themselves.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from nodes_app.runtime.engine.trust import new_capability
from nodes_app.runtime.head.hop_links import link_url
from nodes_app.runtime.hop.link_server import CLOSE_MALFORMED
from nodes_app.runtime.wire.entries import step_fields
from nodes_app.runtime.wire.tensors import tensor_to_bytes
from tests.support.hidden_states import nan_hidden
from tests.support.link import HIDDEN, node_link, tiny_step
from tests.support.network import Network, start_network
from tests.support.nodes import TINY
from tests.support.plans import seal_of, signed_plan, tracker_key
from tracker_app.localnet.databases import fresh_process_database

PROMPT = [{"role": "user", "content": "Tell me about meshes."}]
VOCAB = 259  # the tiny model's


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """Tracker + head (0-1, a small cap on the bytes it reads) + tail (2-3): one route only,
    so a banned node would leave the model without a route."""
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("validation")
        for network in start_network(database_url, tmp, MESHNET_RATE_LIMIT_PER_MINUTE="1000"):
            network.add_node(
                "head",
                TINY,
                (0, 1),
                extra=("--max-request-bytes", "6000"),
                wait=False,
            )
            network.add_node("tail", TINY, (2, 3), wait=False)
            network.wait_for_nodes()
            yield network


def assert_nobody_banned_and_the_next_chat_succeeds(network: Network) -> None:
    assert all(route["status"] != "quarantined" for route in network.routes(TINY))
    response = network.chat(model=TINY, messages=PROMPT, max_tokens=6, temperature=0)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize(
    "sampling",
    [
        {"seed": 2**64, "temperature": 0.7},
        {"top_p": 1e-46, "temperature": 0.7},
        {"seed": -5, "temperature": 0.7},
        {"temperature": 50},
    ],
    ids=["seed-2^64", "top_p-1e-46", "negative-seed", "temperature-50"],
)
def test_sampling_that_crashed_the_tail_is_a_400_and_bans_no_one(
    network: Network, sampling: dict[str, Any]
) -> None:
    response = network.chat(model=TINY, messages=PROMPT, max_tokens=4, **sampling)

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert next(iter(sampling)) in error["message"]
    assert_nobody_banned_and_the_next_chat_succeeds(network)


# JSON nested past the decoder's depth (about 1,000 levels), small enough for every cap.
DEEP = b"[" * 2500 + b"]" * 2500


def test_json_nested_too_deeply_is_a_json_400_at_the_tracker_and_the_head(
    network: Network,
) -> None:
    json_headers = {"Content-Type": "application/json"}
    chat = httpx.post(
        f"{network.url}/v1/chat/completions",
        content=DEEP,
        headers={**network.headers(), **json_headers},
        timeout=60,
    )
    registration = httpx.post(
        f"{network.url}/api/nodes/register", content=DEEP, headers=json_headers, timeout=60
    )
    head = httpx.post(
        f"{network.nodes['head'].endpoint}/v1/generate",
        content=DEEP,
        headers=json_headers,
        timeout=60,
    )

    for answer in (chat, registration, head):
        assert answer.status_code == 400, answer.text
        assert answer.headers["content-type"].startswith("application/json")
        assert answer.json()["error"]["code"] == "invalid_json"
    assert_nobody_banned_and_the_next_chat_succeeds(network)


def test_a_link_frame_nested_too_deeply_closes_that_link_and_the_node_serves_on(
    network: Network,
) -> None:
    tail = network.nodes["tail"]
    frame = len(DEEP).to_bytes(4, "little") + DEEP  # a header of the wire's form, too deep

    with (
        connect(link_url(tail.endpoint), compression=None) as websocket,
        pytest.raises(ConnectionClosed) as closed,
    ):
        websocket.send(frame)
        websocket.recv(timeout=30)

    assert closed.value.rcvd is not None and closed.value.rcvd.code == CLOSE_MALFORMED
    assert_nobody_banned_and_the_next_chat_succeeds(network)


def test_nan_in_a_chat_body_is_a_400_and_bans_no_one(network: Network) -> None:
    body = f'{{"model": "{TINY}", "messages": {json.dumps(PROMPT)}, "temperature": NaN}}'
    response = httpx.post(
        f"{network.url}/v1/chat/completions",
        content=body,
        headers={**network.headers(), "Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"
    assert_nobody_banned_and_the_next_chat_succeeds(network)


def test_past_the_tracker_the_nodes_refuse_the_same_input_themselves(network: Network) -> None:
    # Registered nodes obey only the tracker's signed plans: sign as the tracker does.
    key = tracker_key(network.tracker_key_file)
    head, tail = network.nodes["head"], network.nodes["tail"]
    hops = [head.hop(), tail.hop()]
    body: dict[str, Any] = {
        "request_id": "direct",
        "messages": PROMPT,
        "max_tokens": 4,
        "seed": 2**64,
        "temperature": 0.7,
        "plan": {"model": TINY, "hops": hops},
    }
    # Sealed by hand: the test helper ``signed`` parses the body, and this seed is refused.
    plan = signed_plan(key, request_id="direct", model=TINY, hops=hops)
    body["plan"] = {**body["plan"], **seal_of(plan)}
    direct = httpx.post(f"{head.endpoint}/v1/generate", json=body, timeout=60)

    def opening(request_id: str, rows: int) -> dict[str, Any]:
        plan = signed_plan(key, request_id=request_id, model=TINY, hops=hops)
        return {"plan": plan.to_header(), "capability": new_capability()}

    with node_link(tail.endpoint) as link:
        bad_seed = {**step_fields(tiny_step("bad-seed.step", 2)), "sampling": {"seed": 2**64}}
        step = link.raw_step(bad_seed, tensor_to_bytes(torch.randn(1, 2, HIDDEN)),
                               **opening("bad-seed", 2))  # fmt: skip
        nan = link.step(tiny_step("nan.step", 2), nan_hidden(2), **opening("nan", 2))

    assert (direct.status_code, direct.json()["error"]["code"]) == (400, "bad_sampling")
    assert (step.status, step.code) == (400, "bad_sampling")
    assert (nan.status, nan.code) == (400, "non_finite_input")
    assert tail.health()["cached_sessions"] == 0
    assert_nobody_banned_and_the_next_chat_succeeds(network)


def test_a_body_past_the_heads_byte_cap_is_the_clients_413_and_bans_no_one(
    network: Network,
) -> None:
    # Past the head's 6000 bytes but within the model's context, which the tracker
    # counts itself (a byte-level tokenizer: one token a byte): a control character
    # is one byte, one token, and six bytes in JSON (\u0001).
    too_many_bytes = [{"role": "user", "content": "\x01" * 1100}]

    size = network.chat(model=TINY, messages=too_many_bytes, max_tokens=4)

    assert (size.status_code, size.json()["error"]["code"]) == (413, "request_too_large")
    assert_nobody_banned_and_the_next_chat_succeeds(network)


def test_no_refused_request_was_charged_or_left_processing(network: Network) -> None:
    statuses = dict(
        network.query("SELECT status, COUNT(*) FROM tracker_app_chatrequest GROUP BY status")
    )
    charged_failures = network.query(
        "SELECT COUNT(*) FROM tracker_app_billingrecord b "
        "JOIN tracker_app_chatrequest r ON r.id = b.request_id WHERE r.status <> %s",
        "completed",
    )
    assert set(statuses) <= {"completed", "failed"}
    assert charged_failures == [(0,)]
