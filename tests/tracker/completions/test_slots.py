"""Waiting for a slot on a busy route: back-off that starts afresh after each slot found,
and one deadline for every wait of a choice, past which the client gets a 503."""

from __future__ import annotations

import asyncio
import random

import pytest

from meshnet_site.errors import http_error
from tracker_app.completions.slots import BUSY_RETRY_AFTER_SECONDS, RouteBusyTooLong, SlotWait


class FrozenTime:
    """A clock that only the waits move, a millisecond at least (as a real sleep takes a
    tick: a wait of a rounding error's length would not move a clock this far from 0)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += max(seconds, 0.001)


def slot_wait(time: FrozenTime, deadline: float) -> SlotWait:
    return SlotWait(deadline=deadline, clock=time.clock, sleep=time.sleep, rng=random.Random(3))


def waits(wait: SlotWait, count: int) -> None:
    async def scenario() -> None:
        for _ in range(count):
            await wait.wait()

    asyncio.run(scenario())


def test_each_wait_backs_off_longer_and_a_slot_found_starts_it_afresh() -> None:
    time = FrozenTime()
    wait = slot_wait(time, deadline=60.0)

    waits(wait, 4)
    wait.over()
    waits(wait, 1)

    first, second, third, fourth, again = time.slept
    assert first < second < third < fourth
    assert again <= 0.05 < fourth


def test_waiting_past_the_deadline_is_a_503_route_busy_with_retry_after() -> None:
    time = FrozenTime()
    wait = slot_wait(time, deadline=2.0)

    with pytest.raises(RouteBusyTooLong) as refused:
        waits(wait, 10_000)

    answer = http_error(refused.value)
    assert (answer.status, answer.body["error"]["code"]) == (503, "route_busy")
    assert answer.headers["Retry-After"] == str(BUSY_RETRY_AFTER_SECONDS)
    assert time.now - 100.0 == pytest.approx(2.0, abs=0.01)  # the last wait ends there


def test_the_deadline_counts_every_wait_of_a_choice_not_each_afresh() -> None:
    time = FrozenTime()
    wait = slot_wait(time, deadline=2.0)
    waits(wait, 5)  # 0.05 + 0.1 + 0.2 + 0.4 + 0.8 at most: under the deadline
    spent = time.now - 100.0
    wait.over()
    time.now += 30.0  # streaming, not waiting: this time does not count

    with pytest.raises(RouteBusyTooLong):
        waits(wait, 10_000)

    assert sum(time.slept) == pytest.approx(2.0, abs=0.01)
    assert spent < 2.0
