"""The per-session cache store: KV-budget admission, ceiling, idle reaping on the store's clock."""

from __future__ import annotations

import asyncio

import pytest

from nodes_app.runtime.engine.sessions import SessionStore
from nodes_app.runtime.faults import RuntimeRequestError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def store(
    clock: Clock | None = None, *, cap: int | None = 2, idle: float = 60.0, budget: int = 1000
) -> SessionStore:
    return SessionStore(
        kv_budget=budget, max_sessions=cap, idle_timeout=idle, clock=clock or Clock()
    )


def test_it_refuses_a_second_session_with_the_same_id() -> None:
    sessions = store()
    sessions.create("a", start=0, end=1, cache=object())
    with pytest.raises(RuntimeRequestError) as refused:
        sessions.create("a", start=0, end=1, cache=object())
    assert refused.value.code == "session_exists"


def test_a_full_store_answers_busy_503_not_a_client_error() -> None:
    sessions = store(cap=2)
    sessions.create("a", start=0, end=1, cache=None)
    sessions.create("b", start=0, end=1, cache=None)
    with pytest.raises(RuntimeRequestError) as refused:
        sessions.create("c", start=0, end=1, cache=None)
    assert (refused.value.code, refused.value.status) == ("node_busy", 503)


def test_dropping_a_session_frees_its_slot() -> None:
    sessions = store(cap=1)
    sessions.create("a", start=0, end=1, cache=None)
    assert sessions.drop("a") is True
    assert sessions.drop("a") is False
    assert sessions.create("b", start=0, end=1, cache=None).session_id == "b"


def test_idle_sessions_are_reaped_on_the_stores_clock_and_used_ones_kept() -> None:
    clock = Clock()
    sessions = store(clock, idle=60.0)
    sessions.create("idle", start=0, end=1, cache=None)
    used = sessions.create("used", start=0, end=1, cache=None)
    clock.now += 50
    used.touch()
    clock.now += 20

    assert sessions.reap_idle() == ["idle"]
    assert sessions.get("idle") is None
    assert sessions.get("used") is used


def test_a_session_mid_step_is_never_reaped() -> None:
    clock = Clock()
    sessions = store(clock, idle=1.0)
    busy = sessions.create("busy", start=0, end=1, cache=None)

    async def reap_while_locked() -> list[str]:
        async with busy.lock:
            clock.now += 10
            return sessions.reap_idle()

    assert asyncio.run(reap_while_locked()) == []
    assert sessions.reap_idle() == ["busy"]


def test_sessions_are_admitted_while_their_reservations_fit_the_kv_budget() -> None:
    sessions = store(cap=None, budget=1000)
    sessions.create("a", start=0, end=1, cache=None, reserve=60, reserved_bytes=600)
    sessions.create("b", start=0, end=1, cache=None, reserve=40, reserved_bytes=400)
    with pytest.raises(RuntimeRequestError) as refused:
        sessions.create("c", start=0, end=1, cache=None, reserve=1, reserved_bytes=10)
    assert (refused.value.code, refused.value.status) == ("node_busy", 503)
    assert "KV budget" in str(refused.value)
    assert sessions.reserved == 1000


def test_a_session_that_ends_gives_its_reservation_back() -> None:
    sessions = store(cap=None, budget=1000)
    sessions.create("a", start=0, end=1, cache=None, reserve=100, reserved_bytes=1000)
    sessions.drop("a")
    assert sessions.reserved == 0
    assert sessions.create("b", start=0, end=1, cache=None, reserved_bytes=1000).session_id == "b"


def test_an_outgrown_reservation_grows_without_failing_the_session_and_blocks_newcomers() -> None:
    sessions = store(cap=None, budget=1000)
    grown = sessions.create("a", start=0, end=1, cache=None, reserve=50, reserved_bytes=500)
    sessions.extend(grown, reserve=120, reserved_bytes=1200)
    assert (grown.reserve, sessions.reserved) == (120, 1200)
    with pytest.raises(RuntimeRequestError):
        sessions.create("b", start=0, end=1, cache=None, reserved_bytes=1)
    sessions.drop("a")
    assert sessions.reserved == 0


def test_a_reaped_session_gives_its_reservation_back_and_is_marked_closed() -> None:
    clock = Clock()
    sessions = store(clock, cap=None, idle=1.0, budget=1000)
    idle = sessions.create("idle", start=0, end=1, cache=None, reserved_bytes=700)
    clock.now += 5
    assert sessions.reap_idle() == ["idle"]
    assert (sessions.reserved, idle.closed) == (0, True)


def test_a_session_ends_when_its_plan_says_its_request_is_over_even_mid_step() -> None:
    clock = Clock()
    sessions = store(clock, cap=None, idle=600.0)
    stepping = sessions.create("stepping", start=0, end=1, cache=None, lifetime=30.0)
    abandoned = sessions.create("abandoned", start=0, end=1, cache=None, idle_limit=6.0)
    untold = sessions.create("untold", start=0, end=1, cache=None)

    async def hold_a_step_past_the_end() -> list[str]:
        async with stepping.lock:
            clock.now += 7
            first = sessions.reap_idle()
            stepping.touch()
            clock.now += 30
            return first + sessions.reap_idle()

    assert asyncio.run(hold_a_step_past_the_end()) == ["abandoned", "stepping"]
    assert (stepping.closed, abandoned.closed, untold.closed) == (True, True, False)
