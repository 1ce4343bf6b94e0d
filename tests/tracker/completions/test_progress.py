"""What the Call wall hears of a request: throttled progress, its final count, its queue."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support.fake_heads import (
    Behaviour,
    Net,
    answer,
    relay_until,
    serve,
    text,
    texts_by_choice,
)
from tracker_app.completions import console

pytestmark = pytest.mark.django_db(transaction=True)


def test_progress_reaches_the_dashboard_while_tokens_stream_throttled_and_the_final_count_is_exact(
    net: Net,
) -> None:
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(gap=0.02))  # 12 tokens over ~0.25 s
    proxy = net.proxy(settings={"progress_interval": 0.06})

    chunks = serve(proxy)

    assert text(chunks) == answer(12)
    counts = net.progress_counts()
    assert len(counts) >= 2, counts  # the dashboard saw the request move…
    assert len(counts) < 12, counts  # …not once per token
    assert counts == sorted(counts) and counts[-1] <= 12
    kinds = net.event_kinds()
    assert kinds[-1] == console.COMPLETE  # nothing after the final state
    assert net.event_data(console.COMPLETE)["completion_tokens"] == 12


def test_a_burst_of_tokens_before_a_pause_reaches_the_dashboard_at_the_end_of_the_interval(
    net: Net,
) -> None:
    net.node("whole", 0, 3)
    # Five tokens ~10 ms apart, then the head goes quiet (a long step, say).
    net.heads.plan("whole", Behaviour(tokens=5, then="hang", gap=0.01))
    proxy = net.proxy(settings={"progress_interval": 0.5})

    async def run() -> None:
        await proxy.start()
        await relay_until(proxy, [], lambda: 5 in net.progress_counts())

    asyncio.run(run())

    counts = net.progress_counts()
    # The first token at once, the rest of the burst when the interval ended: no
    # further token came to carry it, and none was sent per token.
    assert counts[-1] == 5 and len(counts) <= 2, counts
    assert net.event_kinds()[-1] == console.ERROR


def test_a_request_that_fails_between_two_progress_events_shows_its_last_count(
    net: Net,
) -> None:
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(tokens=4, then="hang", gap=0.01))
    proxy = net.proxy(settings={"progress_interval": 60.0})  # only the first token's event is due

    async def run() -> None:
        await proxy.start()
        chunks: list[dict[str, Any]] = []
        await relay_until(proxy, chunks, lambda: text(chunks) == answer(4))

    asyncio.run(run())

    assert net.progress_counts()[-1] == 4
    assert net.event_kinds()[-2:] == [console.PROGRESS, console.ERROR]


def test_a_requests_own_choices_are_not_its_queue_on_the_dashboard(net: Net) -> None:
    net.node("whole", 0, 3)
    net.heads.plan("whole", Behaviour(gap=0.02))
    proxy = net.proxy(n=3, settings={"progress_interval": 0.05})

    chunks = serve(proxy)

    assert texts_by_choice(chunks) == {0: answer(12), 1: answer(12), 2: answer(12)}
    queues = [data["queue"] for kind, data in net.events if kind == console.PROGRESS]
    assert queues and set(queues) == {0}, queues
