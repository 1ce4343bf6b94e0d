"""Issue 12: no client can get an honest node banned; blame lands on the node at fault.

Sampling parameters are range-checked by the tracker and again by every node
(one set of ranges, in the protocol); tensors are checked finite where they
arrive and where the head receives them; token ids from the tail are checked
on the head; the sampler refuses NaN logits instead of answering token 0. The
attacks of the issue run against a real tracker and real tiny-model nodes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from meshnet_site.errors import DomainError
from nodes_app.prompting import prompt_token_ids
from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.sampling import (
    SEED_MAX,
    TEMPERATURE_MAX,
    TOP_K_MAX,
    TOP_P_MIN,
    SamplingParams,
)
from nodes_app.protocol.sse import sse_frames
from nodes_app.runtime import wire
from nodes_app.runtime.errors import NonFiniteOutput
from nodes_app.runtime.loading import load_shard
from nodes_app.runtime.sampling import new_generator, sample_token
from nodes_app.runtime.server import create_app
from nodes_app.runtime.service import NodeService
from nodes_app.runtime.sources import resolve_source
from nodes_app.runtime.tiny import tiny_tokenizer
from nodes_app.runtime.trust import PlanGate, new_capability
from tests.support.fake_hop import fake_hop
from tests.support.link import HIDDEN, in_process_link, node_link, tiny_step
from tests.support.network import Network, start_network
from tests.support.nodes import TINY
from tests.support.plans import signed_plan, tracker_key
from tracker_app.completions.chat import chat_params_parse
from tracker_app.localnet import fresh_process_database

PROMPT = [{"role": "user", "content": "Tell me about meshes."}]
VOCAB = 259  # the tiny model's


# --- one set of ranges, on both sides ----------------------------------------------------

ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0.0, max_value=3.0),
    st.sampled_from([0.0, 1e-46, 1e-7, TOP_P_MIN, 1.0, 2.0, 2**63 - 1, 2**63, 2**64]),
    st.text(max_size=4),
)
FIELDS = ("temperature", "top_p", "top_k", "seed")
SAMPLING = st.dictionaries(st.sampled_from(FIELDS), ANY_VALUE)


@settings(max_examples=400, deadline=None)
@given(SAMPLING)
def test_sampling_a_node_accepts_is_in_range_and_never_fails_to_sample(
    fields: dict[str, Any],
) -> None:
    try:
        params = SamplingParams.from_mapping(fields)
    except ProtocolError as error:
        assert error.code == "bad_sampling"
        return
    assert 0.0 <= params.temperature <= TEMPERATURE_MAX
    assert TOP_P_MIN <= params.top_p <= 1.0
    assert 0 <= params.top_k <= TOP_K_MAX
    assert params.seed is None or 0 <= params.seed <= SEED_MAX
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0))
    assert 0 <= sample_token(logits, params, new_generator(params.seed)) < VOCAB


@settings(max_examples=400, deadline=None)
@given(SAMPLING)
def test_the_tracker_accepts_exactly_the_sampling_every_node_accepts(
    fields: dict[str, Any],
) -> None:
    body = json.dumps({"model": TINY, "messages": PROMPT, **fields}).encode()
    try:
        tracker = chat_params_parse(body)
    except DomainError:
        tracker = None
    try:
        node = SamplingParams.from_mapping(fields)
    except ProtocolError:
        node = None
    if tracker is not None:
        # What the tracker sends on, every node takes.
        assert SamplingParams.from_mapping(tracker.sampling().to_json()) == tracker.sampling()
    if node is not None:
        assert tracker is not None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", 2**64),
        ("seed", 2**63),
        ("seed", -1),
        ("top_p", 1e-46),
        ("top_p", 0.0),
        ("temperature", 2.5),
        ("top_k", TOP_K_MAX + 1),
        ("top_k", True),
    ],
)
def test_out_of_range_sampling_is_refused_by_the_tracker_and_the_node_alike(
    field: str, value: Any
) -> None:
    with pytest.raises(ProtocolError) as node:
        SamplingParams.from_mapping({field: value})
    with pytest.raises(DomainError) as tracker:
        chat_params_parse(json.dumps({"model": TINY, "messages": PROMPT, field: value}).encode())
    assert field in node.value.message
    assert field in tracker.value.message


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_in_a_chat_body_are_refused_as_invalid_json(constant: str) -> None:
    body = f'{{"model": "{TINY}", "messages": {json.dumps(PROMPT)}, "temperature": {constant}}}'
    with pytest.raises(DomainError) as caught:
        chat_params_parse(body.encode())
    assert caught.value.code == "invalid_json"


def test_the_edges_of_every_range_are_accepted() -> None:
    params = SamplingParams.from_mapping(
        {"temperature": TEMPERATURE_MAX, "top_p": TOP_P_MIN, "top_k": TOP_K_MAX, "seed": SEED_MAX}
    )
    assert params == SamplingParams(TEMPERATURE_MAX, TOP_P_MIN, TOP_K_MAX, SEED_MAX)
    assert SamplingParams.from_mapping({"temperature": 0, "seed": 0}).greedy


# --- the sampler ------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_the_sampler_refuses_logits_that_are_not_finite_instead_of_answering_token_0(
    temperature: float, bad: float
) -> None:
    logits = torch.zeros(VOCAB)
    logits[5] = bad
    with pytest.raises(NonFiniteOutput):
        sample_token(logits, SamplingParams(temperature=temperature, seed=1), new_generator(1))
    with pytest.raises(NonFiniteOutput):
        sample_token(torch.full((VOCAB,), math.nan), SamplingParams(), new_generator(1))


def test_a_top_p_float32_rounds_to_zero_still_keeps_the_best_token() -> None:
    # Built without validation, as an old tracker might have sent it.
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(3))
    params = SamplingParams(temperature=1.0, top_p=1e-46, seed=2)
    assert sample_token(logits, params, new_generator(2)) == int(logits.argmax())


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-40])
def test_a_temperature_next_to_zero_samples_the_best_token(temperature: float) -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(4))
    params = SamplingParams(temperature=temperature, seed=3)
    assert sample_token(logits, params, new_generator(3)) == int(logits.argmax())


# --- in process: what a node refuses, and whom the head blames ---------------------------


def tiny_service(start: int, end: int, node_id: str) -> NodeService:
    torch.set_num_threads(1)
    shard = load_shard(
        model_key=TINY, source=resolve_source(TINY), start=start, end=end, progress=False
    )
    # Dev-open: these tests call nodes directly, unsigned (tests/security holds the
    # signed-plan checks; the real processes below are registered and closed).
    return NodeService(shard, node_id=node_id, gate=PlanGate(dev_open=True))


@pytest.fixture(scope="module")
def tail() -> Iterator[TestClient]:
    with TestClient(create_app(tiny_service(2, 3, "tail"))) as client:
        yield client


@pytest.fixture(scope="module")
def head() -> Iterator[TestClient]:
    with TestClient(create_app(tiny_service(0, 1, "head"))) as client:
        yield client


def nan_hidden(rows: int) -> bytes:
    hidden = torch.randn(1, rows, HIDDEN)
    hidden[0, 0, 7] = math.nan
    return wire.tensor_to_bytes(hidden)


def test_nan_hidden_states_are_a_400_naming_their_producer_and_the_hop_keeps_serving(
    tail: TestClient,
) -> None:
    with in_process_link(tail) as link:
        refusal = link.step(tiny_step("nan", 3, sender="node-upstream"), nan_hidden(3))

        assert refusal.status == 400
        assert refusal.code == "non_finite_input"
        assert "node-upstream" in refusal.message
        assert tail.get("/v1/health").json()["cached_sessions"] == 0
        good = torch.randn(1, 3, HIDDEN)
        answer = link.step(tiny_step("ok", 3), wire.tensor_to_bytes(good))
        assert answer.status == 200 and isinstance(answer.token_id, int)
        link.cancel("ok")


@pytest.mark.parametrize(
    "sampling", [{"seed": 2**64}, {"top_p": 1e-46, "temperature": 1.0}, {"temperature": 1e9}]
)
def test_a_hop_refuses_sampling_out_of_range_with_a_400_not_a_crash(
    tail: TestClient, sampling: dict[str, Any]
) -> None:
    fields = {**wire.step_fields(tiny_step("s", 2)), "sampling": sampling}

    with in_process_link(tail) as link:
        answer = link.raw_step(fields, wire.tensor_to_bytes(torch.randn(1, 2, HIDDEN)))

    assert answer.status == 400
    assert answer.code == "bad_sampling"


def generate_through(head: TestClient, hops: list[dict[str, Any]]) -> list[Any]:
    body = {
        "request_id": "blame",
        "messages": PROMPT,
        "max_tokens": 4,
        "temperature": 0.0,
        "plan": {"model": TINY, "hops": hops},
    }
    response = head.post("/v1/generate", json=body)
    assert response.status_code == 200, response.text
    return sse_frames(response.text.splitlines())


def head_hop(end: int = 1) -> dict[str, Any]:
    return {"node_id": "head", "endpoint": "http://testserver", "start_layer": 0, "end_layer": end}


def fake(node_id: str, url: str, start: int, end: int) -> dict[str, Any]:
    return {"node_id": node_id, "endpoint": url, "start_layer": start, "end_layer": end}


def blamed(frames: list[Any]) -> tuple[str, str]:
    error = frames[-2]["error"]
    assert frames[-1] == "[DONE]"
    return error["node_id"], error["code"]


@pytest.mark.parametrize("token", [VOCAB, 10**12, -1, True, 2.5, "7"])
def test_a_token_id_outside_the_vocabulary_is_the_tails_fault_not_the_heads(
    head: TestClient, token: Any
) -> None:
    with fake_hop({"token_id": token}) as url:
        frames = generate_through(head, [head_hop(), fake("liar-tail", url, 2, 3)])

    assert blamed(frames) == ("liar-tail", "hop_failed")
    assert "token id" in frames[-2]["error"]["message"]


def test_a_middle_hop_answering_the_wrong_shape_is_that_hops_fault(head: TestClient) -> None:
    one_row = {"dtype": "float32", "shape": [1, 1, HIDDEN]}  # the prefill has many
    with fake_hop(one_row, wire.tensor_to_bytes(torch.randn(1, 1, HIDDEN))) as url:
        frames = generate_through(
            head, [head_hop(), fake("odd-middle", url, 2, 2), fake("tail", url, 3, 3)]
        )

    assert blamed(frames) == ("odd-middle", "hop_failed")


def test_a_hop_refusing_non_finite_input_blames_the_node_that_computed_it(
    head: TestClient,
) -> None:
    refusal = {
        "status": 400,
        "message": "x",
        "type": "invalid_request_error",
        "code": "non_finite_input",
    }
    with fake_hop(refusal) as url:
        frames = generate_through(head, [head_hop(), fake("judging-tail", url, 2, 3)])

    # The head computed what the tail refused: the head is named.
    assert blamed(frames) == ("head", "hop_failed")


def test_a_hop_answer_with_nan_in_it_is_never_relayed(head: TestClient) -> None:
    prompt_rows = len(prompt_token_ids(tiny_tokenizer(), PROMPT))
    nan = nan_hidden(prompt_rows)
    answer = {"dtype": "float32", "shape": [1, prompt_rows, HIDDEN]}
    with fake_hop(answer, nan) as middle, fake_hop({"token_id": 1}) as tail_url:
        frames = generate_through(
            head, [head_hop(), fake("nan-middle", middle, 2, 2), fake("tail", tail_url, 3, 3)]
        )

    assert blamed(frames) == ("nan-middle", "hop_failed")
    assert "not finite" in frames[-2]["error"]["message"]


# --- through real processes: a tracker, a tiny head and tail -----------------------------


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """Tracker + head (0-1, small caps on what it reads) + tail (2-3): one route only,
    so a banned node would leave the model without a route."""
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("validation")
        for network in start_network(database_url, tmp, MESHNET_RATE_LIMIT_PER_MINUTE="1000"):
            network.add_node(
                "head",
                TINY,
                (0, 1),
                extra=("--max-prompt-chars", "2000", "--max-request-bytes", "6000"),
                wait=False,
            )
            network.add_node("tail", TINY, (2, 3), wait=False)
            network.wait_for_nodes()
            yield network


def routes(network: Network) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{network.url}/v1/routing", params={"model": TINY}, headers=network.headers(), timeout=30
    )
    assert response.status_code == 200, response.text
    return list(response.json()["models"][0]["routes"])


def assert_nobody_banned_and_the_next_chat_succeeds(network: Network) -> None:
    assert all(route["status"] != "quarantined" for route in routes(network))
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
    seal = {"expires_at": plan.expires_at, "nonce": plan.nonce, "signature": plan.signature}
    body["plan"] = {**body["plan"], **seal}
    direct = httpx.post(f"{head.endpoint}/v1/generate", json=body, timeout=60)

    def opening(request_id: str, rows: int) -> dict[str, Any]:
        plan = signed_plan(key, request_id=request_id, model=TINY, hops=hops)
        return {"plan": plan.to_header(), "capability": new_capability()}

    with node_link(tail.endpoint) as link:
        bad_seed = {**wire.step_fields(tiny_step("bad-seed.step", 2)), "sampling": {"seed": 2**64}}
        step = link.raw_step(bad_seed, wire.tensor_to_bytes(torch.randn(1, 2, HIDDEN)),
                               **opening("bad-seed", 2))  # fmt: skip
        nan = link.step(tiny_step("nan.step", 2), nan_hidden(2), **opening("nan", 2))

    assert (direct.status_code, direct.json()["error"]["code"]) == (400, "bad_sampling")
    assert (step.status, step.code) == (400, "bad_sampling")
    assert (nan.status, nan.code) == (400, "non_finite_input")
    assert tail.health()["cached_sessions"] == 0
    assert_nobody_banned_and_the_next_chat_succeeds(network)


def test_a_prompt_past_the_heads_caps_is_the_clients_4xx_and_bans_no_one(
    network: Network,
) -> None:
    too_many_chars = [{"role": "user", "content": "x" * 2500}]
    # Past the head's 6000 bytes but within its characters and the model's context,
    # which the tracker now counts itself (a byte-level tokenizer: one token a byte):
    # a control character is one byte, one token, and six bytes in JSON (\u0001).
    too_many_bytes = [{"role": "user", "content": "\x01" * 1100}]

    chars = network.chat(model=TINY, messages=too_many_chars, max_tokens=4)
    size = network.chat(model=TINY, messages=too_many_bytes, max_tokens=4)

    assert (chars.status_code, chars.json()["error"]["code"]) == (400, "prompt_too_long")
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
