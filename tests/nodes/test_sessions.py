"""The per-session cache store: cap, positions' owner, idle reaping on the store's clock."""

from __future__ import annotations

import asyncio

import pytest

from nodes_app.runtime.errors import RuntimeRequestError
from nodes_app.runtime.sessions import SessionStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def store(clock: Clock | None = None, *, cap: int = 2, idle: float = 60.0) -> SessionStore:
    return SessionStore(max_sessions=cap, idle_timeout=idle, clock=clock or Clock())


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
