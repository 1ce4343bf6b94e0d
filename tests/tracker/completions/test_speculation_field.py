"""A request's ``speculation`` field reaches the head; a whole reply's ``meshnet``, and a
stream's last event's, report the drafts its heads sent and accepted (ADR-0028)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nodes_app.protocol.generate import GenerateRequest
from tests.support.fake_heads import Behaviour, Net, served
from tracker_app.completions.chat_request import chat_params_parse
from tracker_app.completions.parameters import InvalidRequest

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("field", "allowed"),
    [({}, True), ({"speculation": "on"}, True), ({"speculation": "off"}, False)],
)
def test_the_heads_are_told_whether_they_may_speculate(
    net: Net, field: dict[str, Any], allowed: bool
) -> None:
    net.node("head", 0, 1)
    net.node("tail", 2, 3)

    served(net.proxy(**field))

    [request] = net.heads.requests
    assert request.speculation is allowed
    # What the head parses is what it was sent: "off" travels, the default is left out.
    assert GenerateRequest.parse(request.to_json()).speculation is allowed
    assert ("speculation" in request.to_json()) is not allowed


def test_a_speculation_value_other_than_on_or_off_is_refused() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "speculation": "max"}

    with pytest.raises(InvalidRequest) as refused:
        chat_params_parse(json.dumps(body).encode())

    assert "speculation" in str(refused.value.message)


def test_a_whole_reply_reports_every_choices_drafts_sent_and_accepted(net: Net) -> None:
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(speculated=(9, 6)))

    chunks, result = served(net.proxy(stream=False, n=2))

    reply: Any = result.reply
    assert reply["meshnet"]["speculation"] == {"drafted": 18, "accepted": 12}
    assert "speculation" not in chunks[0].get("meshnet", {})


def test_a_whole_reply_without_drafts_reports_none(net: Net) -> None:
    net.node("whole", 0, 3)

    _, result = served(net.proxy(stream=False))

    reply: Any = result.reply
    assert reply["meshnet"]["speculation"] == {"drafted": 0, "accepted": 0}


@pytest.mark.parametrize("api", ["chat", "text"])
def test_a_streams_last_event_reports_every_choices_drafts_with_its_usage(
    net: Net, api: str
) -> None:
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(speculated=(9, 6)))
    proxy = net.proxy(n=2) if api == "chat" else net.text_proxy(n=2, max_tokens=12)

    chunks, _ = served(proxy)

    first, last = chunks[0]["meshnet"], chunks[-1]
    assert "speculation" not in first
    assert last["meshnet"] == {**first, "speculation": {"drafted": 18, "accepted": 12}}
    assert last["usage"]["completion_tokens"] == 24
    assert all("meshnet" not in chunk for chunk in chunks[1:-1])
