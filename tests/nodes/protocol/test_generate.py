"""The generate request: what the tracker sends a head parses back; a bad field is named."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.generate import GenerateRequest, stop_sequences
from nodes_app.protocol.limits import MAX_STOP_LENGTH, MAX_STOPS, TOP_LOGPROBS_MAX
from nodes_app.protocol.sampling import LOGIT_BIAS_MAX_ENTRIES, SamplingParams
from nodes_app.protocol.signed_plan import PlanHop

REQUEST = GenerateRequest(
    request_id="req-1",
    model="tiny-random-llama",
    hops=(
        PlanHop("head", "http://head:7001", 0, 1),
        PlanHop("tail", "http://tail:7002", 2, 3),
    ),
    messages=[{"role": "user", "content": "Hello"}],
    max_tokens=32,
    sampling=SamplingParams(temperature=0.7, top_p=0.9, top_k=40, seed=5),
    stop=["\n\n"],
    resume_token_ids=[1, 2, 3],
)


def body(**changes: Any) -> dict[str, Any]:
    """The request's JSON body, through a real JSON round trip, with ``changes`` applied."""
    data: dict[str, Any] = json.loads(json.dumps(REQUEST.to_json()))
    data.update(changes)
    return data


def without_messages(**changes: Any) -> dict[str, Any]:
    """The body of a raw-prompt request: ``messages`` removed, ``changes`` applied."""
    data = body(**changes)
    del data["messages"]
    return data


def refusal(raw: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        GenerateRequest.parse(raw)
    return caught.value


def test_a_generate_request_survives_the_trip_through_json() -> None:
    assert GenerateRequest.parse(body()) == REQUEST


def test_the_body_keeps_the_documented_shape() -> None:
    sent = body()
    assert sent["plan"] == {
        "model": "tiny-random-llama",
        "hops": [
            {"node_id": "head", "endpoint": "http://head:7001", "start_layer": 0, "end_layer": 1},
            {"node_id": "tail", "endpoint": "http://tail:7002", "start_layer": 2, "end_layer": 3},
        ],
    }
    assert {key: sent[key] for key in ("temperature", "top_p", "top_k", "seed", "stop")} == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 5,
        "stop": ["\n\n"],
    }


def test_absent_optional_fields_take_their_defaults() -> None:
    minimal = {key: body()[key] for key in ("request_id", "messages", "plan")}
    parsed = GenerateRequest.parse(minimal)
    assert (parsed.max_tokens, parsed.sampling, parsed.stop, parsed.resume_token_ids) == (
        256,
        SamplingParams(),
        [],
        [],
    )


SCORING = GenerateRequest(
    request_id="req-2",
    model="tiny-random-llama",
    hops=REQUEST.hops,
    messages=[],
    prompt="The capital of France is",
    max_tokens=0,
    sampling=SamplingParams(
        presence_penalty=-0.5, frequency_penalty=1.25, logit_bias=((3, -100.0), (17, 4.5))
    ),
    logprobs=True,
    top_logprobs=5,
    echo=True,
)


def test_a_raw_prompt_with_logprobs_echo_and_penalties_survives_the_trip_through_json() -> None:
    sent = json.loads(json.dumps(SCORING.to_json()))

    assert GenerateRequest.parse(sent) == SCORING
    assert "messages" not in sent
    assert sent["logit_bias"] == {"3": -100.0, "17": 4.5}
    assert (sent["logprobs"], sent["top_logprobs"], sent["echo"]) == (True, 5, True)


def test_a_request_using_none_of_the_new_fields_is_the_body_older_heads_know() -> None:
    assert set(body()) == {
        "request_id",
        "messages",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "resume_token_ids",
        "plan",
    }


def test_null_logprobs_fields_are_their_defaults() -> None:
    parsed = GenerateRequest.parse(body(logprobs=None, top_logprobs=None, echo=None))
    assert (parsed.logprobs, parsed.top_logprobs, parsed.echo) == (False, 0, False)


def test_max_tokens_zero_is_allowed_only_with_echo() -> None:
    assert GenerateRequest.parse(body(max_tokens=0, echo=True)).max_tokens == 0
    assert "0 only with echo" in refusal(body(max_tokens=0)).message


def test_a_single_stop_string_becomes_a_list_and_endpoints_lose_their_slash() -> None:
    raw = body(stop="END")
    raw["plan"]["hops"][0]["endpoint"] = "http://head:7001/"
    parsed = GenerateRequest.parse(raw)
    assert parsed.stop == ["END"]
    assert parsed.hops[0].endpoint == "http://head:7001"


@pytest.mark.parametrize(
    ("raw", "code", "words"),
    [
        ([1, 2], "invalid_request", "JSON object"),
        (body(request_id=""), "invalid_request", "request_id"),
        (body(request_id="x" * 101), "invalid_request", "request_id"),
        (body(messages=[]), "invalid_request", "messages"),
        (body(messages=[{"role": "user"}]), "invalid_request", "content"),
        (body(max_tokens=0), "invalid_request", "max_tokens"),
        (body(max_tokens=True), "invalid_request", "max_tokens"),
        (body(temperature=-1), "bad_sampling", "temperature"),
        (body(top_p=0), "bad_sampling", "top_p"),
        (body(seed="soon"), "bad_sampling", "seed"),
        (body(stop=["a"] * (MAX_STOPS + 1)), "invalid_request", f"at most {MAX_STOPS}"),
        (body(stop=["x" * (MAX_STOP_LENGTH + 1)]), "invalid_request", str(MAX_STOP_LENGTH)),
        (body(stop=[""]), "invalid_request", "non-empty"),
        (body(resume_token_ids=[1, -2]), "invalid_request", "resume_token_ids"),
        (body(plan={"model": "m", "hops": []}), "invalid_plan", "hops"),
        (body(plan={"hops": body()["plan"]["hops"]}), "invalid_plan", "model"),
        (body(prompt="Once upon"), "invalid_request", "exactly one of messages and prompt"),
        ({k: v for k, v in body().items() if k != "messages"}, "invalid_request", "exactly one"),
        (without_messages(prompt=["a", "b"]), "invalid_request", "prompt must be a string"),
        (body(logprobs="yes"), "invalid_request", "logprobs"),
        (body(echo=1), "invalid_request", "echo"),
        (body(logprobs=True, top_logprobs=TOP_LOGPROBS_MAX + 1), "invalid_request", "0..20"),
        (body(top_logprobs=2), "invalid_request", "top_logprobs needs logprobs"),
        (body(max_tokens=-1, echo=True), "invalid_request", "max_tokens"),
        (body(presence_penalty=2.5), "bad_sampling", "presence_penalty"),
        (body(frequency_penalty="high"), "bad_sampling", "frequency_penalty"),
        (body(logit_bias=[1, 2]), "bad_sampling", "logit_bias"),
        (body(logit_bias={"-1": 5}), "bad_sampling", "not a token id"),
        (body(logit_bias={"01": 5}), "bad_sampling", "not a token id"),
        (body(logit_bias={"hello": 5}), "bad_sampling", "not a token id"),
        # A second spelling of id 5 would bias it twice (+200, past the limit).
        (body(logit_bias={"5": 100, "5\n": 100}), "bad_sampling", "not a token id"),
        (body(logit_bias={"5": 100.5}), "bad_sampling", "-100..100"),
        (body(logit_bias={"5": True}), "bad_sampling", "number"),
        (
            body(logit_bias={str(i): 1 for i in range(LOGIT_BIAS_MAX_ENTRIES + 1)}),
            "bad_sampling",
            f"at most {LOGIT_BIAS_MAX_ENTRIES}",
        ),
    ],
)
def test_a_bad_request_is_refused_naming_the_field(raw: Any, code: str, words: str) -> None:
    error = refusal(raw)
    assert error.code == code
    assert words in error.message


@pytest.mark.parametrize(
    ("hop", "change", "words"),
    [
        (0, {"start_layer": 1}, "hop 0 must start at layer 0"),
        (1, {"start_layer": 3}, "must start at layer 2"),
        (1, {"end_layer": 1}, "contiguously"),
        (1, {"end_layer": "3"}, "integers"),
        (1, {"node_id": None}, "node_id"),
    ],
)
def test_a_plan_with_gaps_or_bad_hops_is_refused(
    hop: int, change: dict[str, Any], words: str
) -> None:
    raw = body()
    raw["plan"]["hops"][hop].update(change)
    error = refusal(raw)
    assert error.code == "invalid_plan"
    assert words in error.message


def test_a_hop_missing_a_field_is_named() -> None:
    raw = body()
    del raw["plan"]["hops"][1]["endpoint"]
    assert "lacks 'endpoint'" in refusal(raw).message


def test_the_tracker_and_the_node_apply_the_same_stop_rule() -> None:
    assert stop_sequences(None) == []
    assert stop_sequences("x") == ["x"]
    assert stop_sequences(["a"] * MAX_STOPS) == ["a"] * MAX_STOPS
    with pytest.raises(ProtocolError):
        stop_sequences(["a"] * (MAX_STOPS + 1))
