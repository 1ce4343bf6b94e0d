"""A request's end: its record, its bill, through cancels and database blips.

A request whose client leaves mid-stream is recorded cancelled and charged for
what it was sent (nothing if it was sent nothing); one the network fails after
some of its choices were sent whole is billed for those only; usage a head
inflates is billed at the tracker's count; a database blip as the answer
ends is waited out, the request billed once; a client that leaves while its
answer is billed is still billed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import OperationalError, ProgrammingError

from meshnet_site.database import OUTAGE_RETRY_PAUSES
from nodes_app.shared.prompting import prompt_token_ids
from nodes_app.shared.tokenization import tiny_tokenizer
from tests.support.database_errors import connection_cut
from tests.support.fake_heads import (
    PROMPT_TOKENS,
    Behaviour,
    Net,
    answer,
    record,
    relay,
    relay_until,
    serve,
    serve_until_first_token_then_disconnect,
    text,
    texts_by_choice,
    token_text,
    work,
)
from tracker_app.completions import console, recording
from tracker_app.completions.proxy import CompletionProxy
from tracker_app.models import BillingRecord, RequestStatus

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_client_that_leaves_mid_stream_pays_for_what_it_was_sent_and_the_head_is_let_go(
    net: Net,
) -> None:
    net.model.weight_source = "builtin:tiny-random-llama"  # the tracker counts the prompt
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(tokens=1, then="hang"))
    proxy = net.proxy()
    counted = len(prompt_token_ids(tiny_tokenizer(), [{"role": "user", "content": "hi"}]))

    chunks = serve_until_first_token_then_disconnect(proxy)

    assert text(chunks) == token_text(0)
    request = record(proxy)
    assert (request.status, request.error) == (RequestStatus.CANCELLED, "client disconnected")
    assert (request.prompt_tokens, request.completion_tokens) == (counted, 1)
    bill = BillingRecord.objects.get(request=request)
    assert bill.charge > 0
    assert work(proxy) == [("whole", 0, 3, counted + 1)]  # the node earns what it ran
    assert net.heads.closed == ["whole"]
    assert net.event_kinds()[-1] == console.ERROR
    assert net.banned() == set()


def test_a_client_that_leaves_before_its_first_token_pays_nothing(net: Net) -> None:
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(tokens=0, then="hang"))
    proxy = net.proxy()

    async def leave_at_once() -> None:
        await proxy.start()
        await relay_until(proxy, [], lambda: True)

    asyncio.run(leave_at_once())

    request = record(proxy)
    assert request.status == RequestStatus.CANCELLED
    assert not BillingRecord.objects.filter(request=request).exists()


def test_a_whole_answer_not_yet_sent_when_its_client_left_is_not_charged(net: Net) -> None:
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(tokens=3, then="hang"))
    proxy = net.proxy(stream=False)

    async def leave_after_tokens() -> None:
        await proxy.start()
        await relay_until(proxy, [], lambda: any(g.token_ids for g in proxy.generations))

    asyncio.run(leave_after_tokens())

    request = record(proxy)
    assert request.status == RequestStatus.CANCELLED
    assert not BillingRecord.objects.filter(request=request).exists()


def test_a_tool_call_held_back_when_its_client_left_is_not_charged(net: Net) -> None:
    net.node("whole", 0, 3)
    # A calls object is held back until it is whole; the head stops before it is.
    net.heads.plan("whole", Behaviour(tokens=3, then="hang", texts=('{"', "tool_calls", '":')))
    proxy = net.proxy(
        tools=[{"type": "function", "function": {"name": "get_weather"}}], tool_choice="required"
    )
    chunks: list[dict[str, Any]] = []

    async def leave_once_the_head_sent_it_all() -> None:
        await proxy.start()
        await relay_until(proxy, chunks, lambda: len(proxy.generations[0].token_ids) == 3)

    asyncio.run(leave_once_the_head_sent_it_all())

    assert text(chunks) == ""  # the client got no text and no call
    request = record(proxy)
    assert request.status == RequestStatus.CANCELLED
    assert not BillingRecord.objects.filter(request=request).exists()


def test_a_choice_the_network_fails_after_another_was_sent_whole_bills_only_the_whole_one(
    net: Net,
) -> None:
    whole = net.node("whole", 0, 3)
    # Choice 0 answers all 12 tokens; choice 1 dies after 2, slowly, with no route left.
    net.heads.plan("whole", Behaviour(), Behaviour(tokens=2, then="die", gap=0.2))
    proxy = net.proxy(n=2, route=[whole.id])

    chunks = serve(proxy)

    assert chunks[-1]["error"]["code"] == "upstream_failed"
    assert texts_by_choice(chunks) == {0: answer(12), 1: answer(2)}
    request = record(proxy)
    assert (request.status, request.prompt_tokens, request.completion_tokens) == (
        RequestStatus.PARTIAL,
        PROMPT_TOKENS,
        12,
    )
    assert request.error  # the failure the client was told
    bill = BillingRecord.objects.get(request=request)
    assert bill.completion_charge == net.model.completion_price_per_1k * 12 / 1000
    assert work(proxy) == [("whole", 0, 3, PROMPT_TOKENS + 12)]  # the failed choice earns nothing
    assert net.event_kinds()[-1] == console.ERROR


def test_a_whole_choice_of_an_answer_not_streamed_is_not_billed_when_another_fails(
    net: Net,
) -> None:
    whole = net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(), Behaviour(tokens=2, then="die", gap=0.2))
    proxy = net.proxy(n=2, route=[whole.id], stream=False)

    serve(proxy)

    request = record(proxy)
    assert request.status == RequestStatus.FAILED
    assert not BillingRecord.objects.filter(request=request).exists()


def test_usage_a_head_inflates_is_logged_and_billed_at_the_trackers_count(
    net: Net, caplog: pytest.LogCaptureFixture
) -> None:
    net.model.weight_source = "builtin:tiny-random-llama"
    net.node("whole", 0, 3)
    proxy = net.proxy()
    counted = len(prompt_token_ids(tiny_tokenizer(), [{"role": "user", "content": "hi"}]))
    assert counted != PROMPT_TOKENS  # the fake head always reports 7

    chunks = serve(proxy)

    assert chunks[-1]["usage"]["prompt_tokens"] == counted
    assert record(proxy).prompt_tokens == counted
    assert work(proxy) == [("whole", 0, 3, counted + 12)]
    (line,) = [r.getMessage() for r in caplog.records if "reported" in r.getMessage()]
    assert f"head whole reported {PROMPT_TOKENS} prompt" in line
    assert f"counted {counted} prompt" in line and proxy.request_id in line


# --- the database going away as the answer ends -----------------------------------


@dataclass
class Blips:
    """Stands in for ``recording.chat_request_complete``: the database is away for the
    first ``away`` tries; with ``lost_ack``, the first try's commit goes through and
    only its answer is lost; with ``then_bug``, the try after the outage fails as a
    bug of ours would."""

    away: int = 0
    lost_ack: bool = False
    then_bug: bool = False
    tries: int = 0
    real: Any = recording.chat_request_complete

    def __call__(self, **kwargs: Any) -> Any:
        self.tries += 1
        if self.tries <= self.away:
            raise connection_cut()
        if self.then_bug:
            raise ProgrammingError("column does not exist")
        result = self.real(**kwargs)
        if self.lost_ack and self.tries == 1:
            raise connection_cut()
        return result


def bills(proxy: CompletionProxy) -> int:
    return BillingRecord.objects.filter(request_id=uuid.UUID(proxy.request_id)).count()


def proxy_through(
    net: Net, monkeypatch: pytest.MonkeyPatch, blips: Blips
) -> tuple[CompletionProxy, list[float]]:
    """A proxy on one whole-model node whose completion meets ``blips``, and the pauses
    it takes between tries (recorded, not waited)."""
    net.node("whole", 0, 3)
    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    proxy = net.proxy(settings={"sleep": pause})
    monkeypatch.setattr(recording, "chat_request_complete", blips)
    return proxy, pauses


def test_a_database_blip_as_the_answer_ends_is_waited_out_and_the_request_billed(
    net: Net, monkeypatch: pytest.MonkeyPatch
) -> None:
    blips = Blips(away=2)
    proxy, pauses = proxy_through(net, monkeypatch, blips)

    chunks = serve(proxy)

    assert chunks[-1]["usage"]["completion_tokens"] == 12
    assert (record(proxy).status, bills(proxy)) == (RequestStatus.COMPLETED, 1)
    assert (blips.tries, pauses) == (3, list(OUTAGE_RETRY_PAUSES[:2]))
    assert net.event_kinds()[-1] == console.COMPLETE


def test_a_completion_whose_commit_went_through_before_the_cut_is_billed_once(
    net: Net, monkeypatch: pytest.MonkeyPatch
) -> None:
    blips = Blips(lost_ack=True)
    proxy, _ = proxy_through(net, monkeypatch, blips)

    chunks = serve(proxy)

    assert chunks[-1]["usage"]["completion_tokens"] == 12
    assert (record(proxy).status, bills(proxy), blips.tries) == (RequestStatus.COMPLETED, 1, 2)


def test_a_database_away_past_every_retry_leaves_the_request_open_for_the_sweep(
    net: Net, monkeypatch: pytest.MonkeyPatch
) -> None:
    blips = Blips(away=len(OUTAGE_RETRY_PAUSES) + 1)
    proxy, pauses = proxy_through(net, monkeypatch, blips)

    with pytest.raises(OperationalError):
        serve(proxy)

    assert (record(proxy).status, bills(proxy)) == (RequestStatus.PROCESSING, 0)
    assert (blips.tries, pauses) == (len(OUTAGE_RETRY_PAUSES) + 1, list(OUTAGE_RETRY_PAUSES))


def leave_while_billed(net: Net, until: str) -> tuple[CompletionProxy, list[dict[str, Any]]]:
    """A request whose client leaves while the first try of its completion waits out an
    outage (the consumer cancels, then fails the request); then the proxy carries on
    alone until the console hears ``until``. The proxy, and the chunks its client got."""
    paused, resume = asyncio.Event(), asyncio.Event()

    async def pause(seconds: float) -> None:  # the database is away: the client leaves
        paused.set()
        await resume.wait()

    proxy = net.proxy(settings={"sleep": pause})

    async def run() -> list[dict[str, Any]]:
        await proxy.start()
        chunks: list[dict[str, Any]] = []
        task = asyncio.create_task(relay(proxy, chunks))
        await paused.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await proxy.fail("client disconnected", cancelled=True)  # as the consumer does
        resume.set()
        for _ in range(500):  # the completion ends alone: its console event is its last step
            if until in net.event_kinds():
                break
            await asyncio.sleep(0.01)
        return chunks

    return proxy, asyncio.run(run())


def test_a_client_that_leaves_while_its_answer_is_billed_is_still_billed(
    net: Net, monkeypatch: pytest.MonkeyPatch
) -> None:
    net.node("whole", 0, 3)
    monkeypatch.setattr(recording, "chat_request_complete", Blips(away=1))

    proxy, chunks = leave_while_billed(net, until=console.COMPLETE)

    assert text(chunks) == answer(12)
    assert "usage" not in chunks[-1]
    assert (record(proxy).status, bills(proxy)) == (RequestStatus.COMPLETED, 1)
    assert net.event_kinds()[-1] == console.COMPLETE
    assert console.ERROR not in net.event_kinds()


def test_a_completion_that_fails_after_its_client_left_records_the_request_failed(
    net: Net, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    net.node("whole", 0, 3)
    monkeypatch.setattr(recording, "chat_request_complete", Blips(away=1, then_bug=True))

    with caplog.at_level(logging.ERROR, logger="tracker_app.completions.finishing"):
        proxy, _ = leave_while_billed(net, until=console.ERROR)

    request = record(proxy)
    assert (request.status, request.error, bills(proxy)) == (
        RequestStatus.FAILED,
        "the tracker failed to serve this request",
        0,
    )
    assert net.event_kinds()[-1] == console.ERROR
    assert any(r.exc_info and r.exc_info[0] is ProgrammingError for r in caplog.records)
