"""A hop that fails: who is banned, where the choice resumes, what the client is told.

A head that dies mid-stream, an error frame that blames a hop, a malformed
frame, a head that refuses the request: each bans whom it should (once for
every choice it failed), resumes the choice on another route by replaying
its tokens, with no gap and no repeat, or ends the request when it may not
fail over; a node's own words never reach the client; an echo is scored
once across routes.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from meshnet_site.errors import DomainError, http_error
from tests.support.fake_heads import (
    Behaviour,
    Net,
    answer,
    record,
    serve,
    served,
    text,
    texts_by_choice,
    token_id,
    work,
)
from tracker_app.completions import console
from tracker_app.models import BillingRecord, RequestStatus

pytestmark = pytest.mark.django_db(transaction=True)

MARKER = "SECRET-UPSTREAM-MARKER http://169.254.169.254/latest"


def test_a_head_that_dies_mid_stream_is_banned_and_another_route_resumes_without_gap(
    net: Net,
) -> None:
    net.node("fast", 0, 3, tps=300)
    net.node("slow", 0, 3, tps=100)
    net.heads.plan("fast", Behaviour(tokens=5, then="die"))
    proxy = net.proxy()

    chunks = serve(proxy)

    assert text(chunks) == answer(12)
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    assert net.heads.heads_asked() == ["fast", "slow"]
    assert net.heads.requests[1].resume_token_ids == [token_id(i) for i in range(5)]
    assert net.banned() == {"fast"}
    request = record(proxy)
    assert request.status == RequestStatus.COMPLETED
    assert "slow" in request.route_signature
    # Both routes ran their layers over the prompt and the tokens they saw.
    assert work(proxy) == [("fast", 0, 3, 7 + 5), ("slow", 0, 3, 7 + 5 + 7)]
    assert net.event_kinds().count(console.ROUTE_SELECTED) == 2


@pytest.mark.parametrize("code", ["bad_grammar", None], ids=["tail", "head"])
def test_a_node_that_cannot_follow_the_grammar_fails_the_request_and_keeps_its_standing(
    net: Net, code: str | None
) -> None:
    net.node("head", 0, 1, tps=300)
    net.node("tail", 2, 3, tps=300)
    net.node("whole", 0, 3, tps=50)
    if code is None:  # the head refuses the grammar itself
        refusal = {"error": {"message": "no", "code": "bad_grammar"}}
        net.heads.plan("head", Behaviour(status=400, body=refusal))
    else:  # the head reports that its last hop did
        net.heads.plan("head", Behaviour(tokens=2, then="blame:tail", code=code))
    proxy = net.proxy(response_format={"type": "json_object"})

    chunks = serve(proxy)

    assert chunks[-1]["error"]["code"] == "bad_grammar"
    assert net.banned() == set()
    assert net.heads.heads_asked() == ["head"]  # no failover: another route would refuse too
    assert record(proxy).status == RequestStatus.FAILED
    assert not BillingRecord.objects.exists()


@pytest.mark.parametrize(
    ("blamed", "banned"),
    [("tail", "tail"), ("someone-else", "head")],
    ids=["a-hop-of-the-route", "a-node-outside-the-route-so-the-head"],
)
def test_an_error_frame_bans_the_hop_it_blames_if_that_hop_is_on_the_route(
    net: Net, blamed: str, banned: str
) -> None:
    net.node("head", 0, 1, tps=300)
    net.node("tail", 2, 3, tps=300)
    net.node("whole", 0, 3, tps=50)
    net.heads.plan("head", Behaviour(tokens=3, then=f"blame:{blamed}"), Behaviour())
    proxy = net.proxy()

    chunks = serve(proxy)

    assert text(chunks) == answer(12)
    assert net.banned() == {banned}
    assert net.heads.requests[1].resume_token_ids == [token_id(i) for i in range(3)]
    assert record(proxy).status == RequestStatus.COMPLETED


def test_a_malformed_frame_is_the_heads_failure(net: Net) -> None:
    net.node("garbled", 0, 3, tps=300)
    net.node("sound", 0, 3, tps=100)
    net.heads.plan("garbled", Behaviour(tokens=2, then="garbage"))
    proxy = net.proxy()

    chunks = serve(proxy)

    assert text(chunks) == answer(12)
    assert net.banned() == {"garbled"}
    assert net.heads.heads_asked() == ["garbled", "sound"]


def test_a_head_whose_line_never_ends_is_cut_off_as_the_heads_failure(net: Net) -> None:
    """A line is read only up to the bound on a head's line: the tracker does not hold
    what a head sends without end, and fails over as for any malformed frame."""
    net.node("endless", 0, 3, tps=300)
    net.node("sound", 0, 3, tps=100)
    net.heads.plan("endless", Behaviour(tokens=2, then="endless"))
    proxy = net.proxy()

    chunks = serve(proxy)

    assert text(chunks) == answer(12)
    assert net.banned() == {"endless"}
    assert net.heads.heads_asked() == ["endless", "sound"]


def test_when_failovers_run_out_the_stream_ends_with_an_error_and_nothing_is_charged(
    net: Net,
) -> None:
    for i, node_id in enumerate(["a", "b", "c", "d", "e"]):
        net.node(node_id, 0, 3, tps=500 - 100 * i)
        net.heads.plan(node_id, Behaviour(connect_error=True))
    proxy = net.proxy()

    chunks = serve(proxy)

    error = chunks[-1]["error"]
    assert (error["code"], error["type"]) == ("upstream_failed", "upstream_error")
    assert "too many failovers" in error["message"]
    assert net.heads.heads_asked() == ["a", "b", "c", "d"]
    assert net.banned() == {"a", "b", "c", "d"}
    request = record(proxy)
    assert request.status == RequestStatus.FAILED
    assert not BillingRecord.objects.filter(request=request).exists()


def test_a_pinned_route_never_fails_over(net: Net) -> None:
    net.node("pinned", 0, 3, tps=100)
    net.node("other", 0, 3, tps=300)
    net.heads.plan("pinned", Behaviour(tokens=2, then="die"))
    proxy = net.proxy(route=["pinned"])

    chunks = serve(proxy)

    assert text(chunks) == answer(2)
    assert chunks[-1]["error"]["code"] == "upstream_failed"
    assert "pinned route" in chunks[-1]["error"]["message"]
    assert net.heads.heads_asked() == ["pinned"]
    assert record(proxy).status == RequestStatus.FAILED


def test_a_head_that_refuses_the_request_passes_its_code_on_not_its_text_and_bans_nobody(
    net: Net,
) -> None:
    net.node("whole", 0, 3)
    refusal = {"error": {"message": "too long", "type": "x", "code": "context_length_exceeded"}}
    net.heads.plan("whole", Behaviour(status=400, body=refusal))
    proxy = net.proxy()

    chunks, result = served(proxy)

    error = chunks[-1]["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert "whole" in error["message"] and "too long" not in error["message"]
    assert isinstance(result.error, DomainError)
    assert http_error(result.error).status == 400
    assert net.banned() == set()
    assert record(proxy).status == RequestStatus.FAILED


def test_a_head_that_refuses_a_prompt_the_tracker_counted_is_banned_and_failed_over(
    net: Net,
) -> None:
    net.model.weight_source = "builtin:tiny-random-llama"  # a tokenizer the tracker loads
    net.node("liar", 0, 3, tps=1e12)
    net.node("honest", 0, 3)
    refusal = {"error": {"message": "too long", "type": "x", "code": "context_length_exceeded"}}
    net.heads.plan("liar", Behaviour(status=400, body=refusal))
    proxy = net.proxy()

    chunks = serve(proxy)

    assert text(chunks) == answer(12)
    assert net.heads.heads_asked() == ["liar", "honest"]
    assert net.banned() == {"liar"}
    assert record(proxy).status == RequestStatus.COMPLETED


@pytest.mark.parametrize(
    ("status", "code", "kind_status"),
    [(413, "request_too_large", 413), (400, "request_too_large", 400)],
)
def test_a_head_refusing_a_counted_prompt_past_its_own_byte_cap_bans_nobody(
    net: Net, status: int, code: str, kind_status: int
) -> None:
    # The head's --max-request-bytes is a cap the tracker cannot know: even for a
    # prompt it counted, such a refusal is the client's.
    net.model.weight_source = "builtin:tiny-random-llama"  # a tokenizer the tracker loads
    net.node("small", 0, 3)
    refusal = {"error": {"message": "too big", "type": "x", "code": code}}
    net.heads.plan("small", Behaviour(status=status, body=refusal))
    proxy = net.proxy()

    chunks, result = served(proxy)

    assert chunks[-1]["error"]["code"] == code
    assert "too big" not in chunks[-1]["error"]["message"]
    assert isinstance(result.error, DomainError)
    assert http_error(result.error).status == kind_status
    assert net.banned() == set()
    assert record(proxy).status == RequestStatus.FAILED


def test_a_head_refusing_sampling_the_tracker_checked_is_banned_even_for_an_uncounted_prompt(
    net: Net,
) -> None:
    # The tracker checks sampling with the nodes' own rule before it sends anything.
    net.node("liar", 0, 3, tps=1e12)
    net.node("honest", 0, 3)
    refusal = {"error": {"message": "no", "type": "x", "code": "bad_sampling"}}
    net.heads.plan("liar", Behaviour(status=400, body=refusal))
    proxy = net.proxy()

    chunks = serve(proxy)

    assert text(chunks) == answer(12)
    assert net.heads.heads_asked() == ["liar", "honest"]
    assert net.banned() == {"liar"}


def test_a_head_refusing_a_logit_bias_is_the_clients_400_as_only_nodes_know_the_vocabulary(
    net: Net,
) -> None:
    net.node("whole", 0, 3)
    refusal = {"error": {"message": "no", "type": "x", "code": "bad_sampling"}}
    net.heads.plan("whole", Behaviour(status=400, body=refusal))
    proxy = net.proxy(logit_bias={"999999": 3})

    chunks = serve(proxy)

    error = chunks[-1]["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "bad_sampling",
        "logit_bias",
        "invalid_request_error",
    )
    assert net.heads.heads_asked() == ["whole"]
    assert net.banned() == set()
    assert net.heads.requests[0].sampling.logit_bias == ((999999, 3.0),)


@pytest.mark.parametrize(
    "behaviour",
    [
        Behaviour(tokens=2, then="blame:whole", message=MARKER),
        Behaviour(status=500, body={"error": {"message": MARKER, "code": MARKER}}),
        Behaviour(status=400, body={"error": {"message": MARKER, "code": "Not A Code!"}}),
    ],
    ids=["error-frame", "http-500-body", "http-400-body"],
)
def test_a_nodes_own_words_never_reach_the_client(net: Net, behaviour: Behaviour) -> None:
    net.node("whole", 0, 3)
    net.heads.plan("whole", behaviour)
    proxy = net.proxy(route=["whole"])

    chunks = serve(proxy)

    error = chunks[-1]["error"]
    assert "whole" in error["message"]
    assert MARKER not in json.dumps(chunks)
    assert MARKER not in (record(proxy).error or "")
    assert "169.254" not in json.dumps(net.events)


def test_a_choice_whose_head_dies_fails_over_alone_while_the_others_go_on(net: Net) -> None:
    net.node("fast", 0, 3, tps=300)
    net.node("slow", 0, 3, tps=100)
    net.heads.plan("fast", Behaviour(tokens=5, then="die"), Behaviour())
    proxy = net.proxy(n=2)

    chunks = serve(proxy)

    assert texts_by_choice(chunks) == {0: answer(12), 1: answer(12)}
    assert net.heads.heads_asked() == ["fast", "fast", "slow"]
    assert net.heads.requests[2].resume_token_ids == [token_id(i) for i in range(5)]
    assert net.banned() == {"fast"}
    assert chunks[-1]["usage"]["completion_tokens"] == 24
    # fast: one whole choice (7 + 12) and five tokens of the other (7 + 5);
    # slow: that choice's prompt and five replayed tokens, then its last seven.
    assert work(proxy) == [("fast", 0, 3, 19 + 12), ("slow", 0, 3, 7 + 5 + 7)]
    assert record(proxy).status == RequestStatus.COMPLETED


def test_a_node_that_dies_under_every_choice_is_banned_once_not_once_per_choice(
    net: Net, caplog: pytest.LogCaptureFixture
) -> None:
    net.node("fast", 0, 3, tps=300)
    net.node("slow", 0, 3, tps=100)
    net.heads.plan("fast", Behaviour(tokens=5, then="die", gap=0.01))
    proxy = net.proxy(n=4)

    with caplog.at_level(logging.INFO, logger="tracker_app.completions.failover"):
        chunks = serve(proxy)

    assert texts_by_choice(chunks) == {i: answer(12) for i in range(4)}
    assert net.heads.heads_asked() == ["fast"] * 4 + ["slow"] * 4
    bans = [r.getMessage() for r in caplog.records if "banned for" in r.getMessage()]
    assert len(bans) == 1 and bans[0].endswith("banned for 30 s"), bans  # the first step
    assert net.banned() == {"fast"}


def test_a_choice_that_cannot_fail_over_fails_the_request_and_lets_the_other_heads_go(
    net: Net,
) -> None:
    whole = net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(tokens=2, then="hang"), Behaviour(tokens=1, then="die"))
    proxy = net.proxy(n=2, route=[whole.id])

    chunks = serve(proxy)

    assert chunks[-1]["error"]["code"] == "upstream_failed"
    request = record(proxy)
    assert request.status == RequestStatus.FAILED
    assert not BillingRecord.objects.filter(request=request).exists()
    # The hanging choice's stream was closed too: its head frees its sessions.
    assert net.heads.closed == ["whole", "whole"]


# --- echo ---------------------------------------------------------------------


def echo_asked(net: Net) -> list[bool]:
    """Whether each send asked its head to score the prompt."""
    return [request.echo for request in net.heads.requests]


def test_an_echo_already_relayed_is_not_scored_again_by_the_failover_route(net: Net) -> None:
    net.node("fast", 0, 3, tps=300)
    net.node("slow", 0, 3, tps=100)
    net.heads.plan("fast", Behaviour(tokens=5, then="die"))
    proxy = net.text_proxy(echo=True, logprobs=1, max_tokens=12)

    chunks = serve(proxy)

    assert "".join(c["choices"][0]["text"] for c in chunks) == "hi" + answer(12)
    assert net.heads.heads_asked() == ["fast", "slow"]
    assert echo_asked(net) == [True, False]


def test_an_echo_without_logprobs_is_the_trackers_own_text_and_asks_no_scores(net: Net) -> None:
    net.node("whole", 0, 3)
    proxy = net.text_proxy(echo=True, max_tokens=3)

    chunks = serve(proxy)

    assert "".join(c["choices"][0]["text"] for c in chunks) == "hi" + answer(3)
    assert echo_asked(net) == [False]


def test_a_scoring_echo_resent_after_its_echo_still_asks_for_it_as_no_token_is_asked(
    net: Net,
) -> None:
    net.node("fast", 0, 3, tps=300)
    net.node("slow", 0, 3, tps=100)
    net.heads.plan("fast", Behaviour(tokens=0, then="die"))
    proxy = net.text_proxy(echo=True, logprobs=1, max_tokens=0)

    serve(proxy)

    assert net.heads.heads_asked() == ["fast", "slow"]
    assert echo_asked(net) == [True, True]


def test_a_prompt_too_long_to_score_is_refused_only_when_its_scores_are_asked(net: Net) -> None:
    net.model.weight_source = "builtin:tiny-random-llama"  # 4096 positions
    net.node("whole", 0, 3)
    prompt = "x" * 3000  # 6 scores a token with 5 alternatives: past 2^14
    scoring = net.text_proxy(prompt=prompt, echo=True, logprobs=5, max_tokens=1)
    echoing = net.text_proxy(prompt=prompt, echo=True, max_tokens=1)

    with pytest.raises(DomainError) as refused:
        asyncio.run(scoring.start())
    asyncio.run(echoing.start())

    assert refused.value.code == "prompt_too_long"
    assert echoing.generations[0].prompt_count.tokens * 6 > 2**14
