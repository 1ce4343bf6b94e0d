"""Nodes obey only tracker-signed plans; hop sessions answer only to their capability.

Each attack is reproduced where it can be (on a ``--dev-open`` node, which behaves as
every node did before plans were signed) and shown refused by a real tracker's real nodes:
a ``runtracker`` under daphne and tiny-model ``runnode`` processes registered with it (the
tail pinned with ``--tracker-key``, the others trusting the published key on first use).
"""

from __future__ import annotations

import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nodes_app.protocol.limits import TRACKER_KEY_PATH
from nodes_app.protocol.signed_plan import SignedPlan
from nodes_app.runtime.engine.trust import new_capability
from nodes_app.runtime.wire.entries import StepAnswer
from nodes_app.shared.signing import wallet_of
from tests.support.decoy import MARKER, Decoy, running_decoy
from tests.support.fake_hop import fake_hop
from tests.support.link import node_link, tiny_step
from tests.support.network import Network, start_network
from tests.support.nodes import TINY
from tests.support.nodes import start_node as start_dev_open_node
from tests.support.plans import signed, signed_plan, tracker_key
from tests.support.sse import chunks_of, completion, read_sse
from tracker_app.localnet import NodeProcess, fresh_process_database, start_node, wait_until

HIDDEN_ROWS = 3
HIDDEN = bytes(4 * 64 * HIDDEN_ROWS)  # three float32 rows of the tiny model's hidden size


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """Tracker + head (0-1) + tail (2-3, pinned with --tracker-key) + whole (0-3)."""
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("signed-plans")
        for network in start_network(database_url, tmp, MESHNET_RATE_LIMIT_PER_MINUTE="1000"):
            published = httpx.get(f"{network.url}{TRACKER_KEY_PATH}").json()["public_key"]
            network.add_node("head", TINY, (0, 1), wait=False)
            network.add_node("tail", TINY, (2, 3), extra=["--tracker-key", published], wait=False)
            network.add_node("whole", TINY, (0, 3), wait=False)
            network.wait_for_route(TINY)
            yield network


@pytest.fixture(scope="module")
def open_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A ``--dev-open`` whole-model node without a tracker: every node before plans were signed.

    Its eight session slots are those nodes' old fixed cap (nodes now admit by KV budget).
    """
    tmp = tmp_path_factory.mktemp("dev-open")
    node = start_dev_open_node(
        tmp, TINY, (0, 3), node_id="open-whole", extra_args=["--max-sessions", "8"]
    )
    with node.process:
        node.wait_serving(timeout=120)
        yield node


@pytest.fixture
def decoy() -> Iterator[Decoy]:
    with running_decoy() as running:
        yield running


def key(network: Network) -> Ed25519PrivateKey:
    return tracker_key(network.tracker_key_file)


def generate_body(*hops: dict[str, Any], max_tokens: int = 8) -> dict[str, Any]:
    return {
        "request_id": f"attack-{uuid.uuid4().hex}",
        "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "plan": {"model": TINY, "hops": list(hops)},
    }


def generate(node: NodeProcess, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{node.endpoint}/v1/generate", json=body, timeout=60)


def step(
    node: NodeProcess,
    session: str,
    *,
    position: int = 0,
    rows: int = HIDDEN_ROWS,
    plan: SignedPlan | None = None,
    capability: str | None = None,
) -> StepAnswer:
    """One binary step of layers 2-3 (hidden states of zeros) to ``node``, on a link."""
    with node_link(node.endpoint) as link:
        return link.step(
            tiny_step(session, rows, position=position),
            bytes(4 * 64 * rows),
            capability=capability,
            plan=None if plan is None else plan.to_header(),
        )


def delete(node: NodeProcess, session: str, capability: str | None = None) -> StepAnswer:
    with node_link(node.endpoint) as link:
        return link.cancel(session, capability=capability)


def refused(response: httpx.Response | StepAnswer, status: int, code: str) -> str:
    """The refusal's message, after checking its status, code and the error shape."""
    if isinstance(response, StepAnswer):
        assert (response.status, response.code) == (status, code), response
        assert response.error_type and response.message
        return response.message
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code"}
    assert error["code"] == code, error
    return str(error["message"])


def sessions(node: NodeProcess) -> int:
    return int(node.health()["active_sessions"])


def head_tail_plan(network: Network, request_id: str, **changes: Any) -> SignedPlan:
    head, tail = network.nodes["head"], network.nodes["tail"]
    return signed_plan(
        key(network), request_id=request_id, model=TINY, hops=[head.hop(), tail.hop()], **changes
    )


# --- the tracker's key -------------------------------------------------------------


def test_the_tracker_publishes_its_key_to_anyone_and_keeps_the_private_half_0600(
    network: Network,
) -> None:
    published = httpx.get(f"{network.url}{TRACKER_KEY_PATH}", timeout=30)

    assert published.status_code == 200
    assert published.json() == {"algorithm": "ed25519", "public_key": wallet_of(key(network))}
    assert network.tracker_key_file is not None
    assert stat.S_IMODE(network.tracker_key_file.stat().st_mode) == 0o600
    assert "(trusted on first use)" in network.nodes["head"].output()
    assert "(pinned by --tracker-key)" in network.nodes["tail"].output()


def test_a_node_pinned_to_another_tracker_key_refuses_to_start(
    network: Network, tmp_path: Path
) -> None:
    other = wallet_of(Ed25519PrivateKey.generate())
    node = start_node(
        name="mispinned", model=TINY, layers=(0, 3), env=network.env, log_dir=tmp_path,
        tracker=network.url, wallet_key=tmp_path / "mispinned.key",
        extra=["--tracker-key", other],
    )  # fmt: skip
    try:
        assert node.process.wait(timeout=120) != 0
    finally:
        node.stop()
    assert f"not the pinned {other}" in node.output()
    assert " serving " not in node.output()


# --- nodes serve anyone (the first attack) -------------------------------------------


def test_anonymous_generate_and_steps_are_refused_before_they_take_a_slot(
    network: Network,
) -> None:
    head, tail, whole = network.nodes["head"], network.nodes["tail"], network.nodes["whole"]

    refused(generate(head, generate_body(head.hop(), tail.hop())), 401, "plan_required")
    refused(step(tail, "anyone.s1"), 401, "plan_required")
    refused(step(tail, "anyone.s2", capability=new_capability()), 401, "plan_required")
    refused(step(whole, "anyone.s3", position=5), 400, "unknown_session")

    assert [sessions(node) for node in (head, tail, whole)] == [0, 0, 0]


def test_eight_anonymous_requests_no_longer_fill_a_nodes_slots(
    network: Network, open_node: NodeProcess
) -> None:
    # Reproduced on a dev-open node: eight anonymous steps take all eight slots.
    flood = [f"flood.{i}" for i in range(8)]
    assert [step(open_node, sid).status for sid in flood] == [200] * 8
    assert sessions(open_node) == 8
    refused(step(open_node, "flood.9"), 503, "node_busy")
    assert {delete(open_node, sid).status for sid in flood} == {204}

    whole = network.nodes["whole"]
    for i in range(8):
        refused(step(whole, f"flood.{i}"), 401, "plan_required")
        refused(generate(whole, generate_body(whole.hop())), 401, "plan_required")
    assert sessions(whole) == 0
    answer = network.chat(model=TINY, messages=[{"role": "user", "content": "hi"}],
                          max_tokens=6, temperature=0, route=[whole.node_id])  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 6


def test_a_wrong_capability_can_neither_step_nor_delete_anothers_session(
    network: Network,
) -> None:
    tail = network.nodes["tail"]
    plan = head_tail_plan(network, "owned")
    mine = new_capability()
    opened = step(tail, "owned.a1", plan=plan, capability=mine)
    assert opened.status == 200, opened

    position: dict[str, Any] = {"position": HIDDEN_ROWS, "rows": 1}
    refused(step(tail, "owned.a1", **position), 401, "capability_required")
    refused(step(tail, "owned.a1", capability=new_capability(), **position), 403,
            "capability_invalid")  # fmt: skip
    refused(delete(tail, "owned.a1"), 401, "capability_required")
    refused(delete(tail, "owned.a1", new_capability()), 403, "capability_invalid")
    assert step(tail, "owned.a1", capability=mine, **position).status == 200
    assert delete(tail, "owned.a1", mine).status == 204
    assert sessions(tail) == 0


def test_a_plan_opens_only_sessions_of_its_request_on_the_layers_it_names(
    network: Network,
) -> None:
    tail = network.nodes["tail"]
    capability = new_capability()

    wrong_session = step(tail, "another-request.x", plan=head_tail_plan(network, "mine"),
                         capability=capability)  # fmt: skip
    refused(wrong_session, 403, "plan_mismatch")
    head, whole = network.nodes["head"], network.nodes["whole"]
    elsewhere = signed_plan(key(network), request_id="mine", model=TINY,
                            hops=[head.hop(), whole.hop(2, 3)])  # fmt: skip
    refused(step(tail, "mine.x", plan=elsewhere, capability=capability), 403, "plan_mismatch")
    wrong_layers = signed_plan(key(network), request_id="mine", model=TINY,
                               hops=[head.hop(0, 2), tail.hop(3, 3)])  # fmt: skip
    refused(step(tail, "mine.x", plan=wrong_layers, capability=capability), 403, "plan_mismatch")
    refused(step(tail, "mine.x", plan=head_tail_plan(network, "mine")), 401, "capability_required")
    assert sessions(tail) == 0


# --- forged, expired, altered and replayed plans ------------------------------------


def test_a_plan_signed_by_another_key_is_refused(network: Network) -> None:
    head, tail = network.nodes["head"], network.nodes["tail"]
    forger = Ed25519PrivateKey.generate()

    body = signed(generate_body(head.hop(), tail.hop()), forger)
    refused(generate(head, body), 403, "plan_signature_invalid")
    forged = signed_plan(forger, request_id="forged", model=TINY, hops=[head.hop(), tail.hop()])
    refused(step(tail, "forged.x", plan=forged, capability=new_capability()), 403,
            "plan_signature_invalid")  # fmt: skip
    assert sessions(head) == sessions(tail) == 0


def test_an_expired_plan_is_refused(network: Network) -> None:
    head, tail = network.nodes["head"], network.nodes["tail"]

    body = signed(generate_body(head.hop(), tail.hop()), key(network), expires_at=time.time() - 1)
    refused(generate(head, body), 403, "plan_expired")
    stale = head_tail_plan(network, "stale", expires_at=time.time() - 1)
    refused(step(tail, "stale.x", plan=stale, capability=new_capability()), 403, "plan_expired")


@pytest.mark.parametrize("alteration", ["endpoint-swapped", "hop-added"])
def test_a_plan_altered_after_signing_never_sends_hidden_states_elsewhere(
    network: Network, open_node: NodeProcess, decoy: Decoy, alteration: str
) -> None:
    # Reproduced on a dev-open head: it sends hidden states wherever the plan says.
    reproduced = read_sse(
        f"{open_node.endpoint}/v1/generate",
        generate_body(open_node.hop(0, 1), {**open_node.hop(2, 3), "endpoint": decoy.endpoint}),
    )
    assert reproduced[-2]["error"]["code"] == "hop_failed"
    # The head also asks the decoy to free the session it failed to open.
    wait_until(lambda: len(decoy.calls) == 2)
    assert decoy.calls[0] == "GET /v1/link"
    decoy.calls.clear()

    head, tail = network.nodes["head"], network.nodes["tail"]
    body = signed(generate_body(head.hop(), tail.hop()), key(network))
    if alteration == "endpoint-swapped":
        body["plan"]["hops"][1]["endpoint"] = decoy.endpoint
    else:
        decoy_hop = {**tail.hop(2, 2), "endpoint": decoy.endpoint}
        body["plan"]["hops"][1:] = [decoy_hop, tail.hop(3, 3)]
    refused(generate(head, body), 403, "plan_signature_invalid")
    assert decoy.calls == []


def test_a_replayed_plan_is_refused_on_the_head_and_on_every_hop(network: Network) -> None:
    head, tail, whole = network.nodes["head"], network.nodes["tail"], network.nodes["whole"]
    body = signed(generate_body(whole.hop()), key(network))
    first = read_sse(f"{whole.endpoint}/v1/generate", body)
    assert completion(first)[2]["usage"]["completion_tokens"] == 8

    refused(generate(whole, body), 403, "plan_replayed")

    plan, capability = head_tail_plan(network, "once"), new_capability()
    opened = step(tail, "once.a", plan=plan, capability=capability)
    assert opened.status == 200, opened
    refused(step(tail, "once.b", plan=plan, capability=new_capability()), 403, "plan_replayed")
    assert delete(tail, "once.a", capability).status == 204
    assert sessions(head) == sessions(tail) == 0


# --- what still works ------------------------------------------------------------------


@pytest.mark.parametrize("route", [["whole"], ["head", "tail"]], ids=["one-hop", "two-hops"])
def test_chats_through_the_tracker_still_work(network: Network, route: list[str]) -> None:
    nodes = [network.nodes[name] for name in route]
    frames = network.stream(model=TINY, messages=[{"role": "user", "content": "Hello"}],
                            max_tokens=12, temperature=0,
                            route=[node.node_id for node in nodes])  # fmt: skip

    chunks = chunks_of(frames)
    assert frames[-1] == "[DONE]"
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    assert [hop["node_id"] for hop in chunks[0]["meshnet"]["hops"]] == [n.node_id for n in nodes]
    wait_until(lambda: all(sessions(node) == 0 for node in nodes))


def test_a_dev_open_node_serves_direct_unsigned_calls(open_node: NodeProcess) -> None:
    frames = read_sse(f"{open_node.endpoint}/v1/generate", generate_body(open_node.hop()))

    text, ids, last = completion(frames)
    assert text
    assert len(ids) == 8 == last["usage"]["completion_tokens"]
    assert "WARNING: --dev-open" in open_node.output()


def test_a_hops_error_text_never_reaches_the_heads_caller(
    open_node: NodeProcess, decoy: Decoy
) -> None:
    frames = read_sse(
        f"{open_node.endpoint}/v1/generate",
        generate_body(open_node.hop(0, 1), {**open_node.hop(2, 3), "endpoint": decoy.endpoint}),
    )

    error = frames[-2]["error"]
    assert error["node_id"] == open_node.node_id
    assert "HTTP 500" in error["message"]
    assert MARKER not in str(frames)
    # A hop that speaks the link and answers a refusal in its own words.
    refusal = {"status": 500, "code": MARKER, "type": "server_error", "message": MARKER}
    with fake_hop(refusal) as liar:
        frames = read_sse(
            f"{open_node.endpoint}/v1/generate",
            generate_body(open_node.hop(0, 1), {**open_node.hop(2, 3), "endpoint": liar}),
        )
    assert frames[-2]["error"]["code"] == "hop_failed"
    assert "status 500" in frames[-2]["error"]["message"]
    assert MARKER not in str(frames)
