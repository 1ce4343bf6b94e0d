"""Speculation's fields in the protocol (ADR-0028): the request's switch, the usage's counts."""

from __future__ import annotations

from typing import Any

import pytest

from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.usage import Usage

BODY: dict[str, Any] = {
    "request_id": "r",
    "messages": [{"role": "user", "content": "hi"}],
    "plan": {
        "model": "m",
        "hops": [{"node_id": "a", "endpoint": "http://a", "start_layer": 0, "end_layer": 3}],
    },
}


@pytest.mark.parametrize(("value", "allowed"), [(None, True), ("on", True), ("off", False)])
def test_a_generate_request_says_whether_the_head_may_speculate(value: Any, allowed: bool) -> None:
    request = GenerateRequest.parse({**BODY, "speculation": value})

    assert request.speculation is allowed
    assert GenerateRequest.parse(request.to_json()) == request


@pytest.mark.parametrize("value", ["max", True, 0])
def test_a_speculation_other_than_on_or_off_is_refused(value: Any) -> None:
    with pytest.raises(ProtocolError, match="speculation"):
        GenerateRequest.parse({**BODY, "speculation": value})


def test_usage_reports_drafts_sent_and_accepted_only_when_any_were_sent() -> None:
    usage = Usage(prompt_tokens=7, completion_tokens=20, drafted_tokens=18, accepted_tokens=12)

    assert Usage.parse(usage.to_json()) == usage
    assert "drafted_tokens" not in Usage(7, 20).to_json()


@pytest.mark.parametrize(
    "counts",
    [
        {"drafted_tokens": 3, "accepted_tokens": 4},
        {"drafted_tokens": 30, "accepted_tokens": 21},
        {"drafted_tokens": -1},
    ],
)
def test_usage_refuses_more_accepted_than_drafted_or_delivered(counts: dict[str, int]) -> None:
    with pytest.raises(ProtocolError):
        Usage.parse({"prompt_tokens": 7, "completion_tokens": 20, **counts})
