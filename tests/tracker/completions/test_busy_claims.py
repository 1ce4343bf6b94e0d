"""Whether a node's "busy" holds up: explained by the sessions this tracker holds on it
or the ones it reported, it is waited for; unexplained past the grace, it is a lie and
the node fails like any failed node."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.support.routing import make_model, make_node
from tracker_app.completions.busy_claims import BUSY_CLAIMS, BusyClaims, busy_claim_judged
from tracker_app.completions.head_queue import HEAD_QUEUES
from tracker_app.completions.head_stream import RouteBusy

GRACE = 10.0


@pytest.fixture(autouse=True)
def _no_streaks() -> Iterator[None]:
    BUSY_CLAIMS.reset()
    yield
    BUSY_CLAIMS.reset()


def test_busy_answers_unexplained_for_the_grace_are_a_false_claim() -> None:
    claims = BusyClaims()

    assert not claims.claim("n", explained=False, now=100.0, grace=GRACE)
    assert not claims.claim("n", explained=False, now=109.0, grace=GRACE)
    assert claims.claim("n", explained=False, now=110.0, grace=GRACE)
    assert not claims.claim("other", explained=False, now=110.0, grace=GRACE)


def test_an_explained_claim_or_a_token_served_ends_the_streak() -> None:
    claims = BusyClaims()
    claims.claim("n", explained=False, now=100.0, grace=GRACE)
    claims.claim("m", explained=False, now=100.0, grace=GRACE)

    claims.claim("n", explained=True, now=105.0, grace=GRACE)
    claims.served(["m"])

    assert not claims.claim("n", explained=False, now=111.0, grace=GRACE)
    assert not claims.claim("m", explained=False, now=111.0, grace=GRACE)


def test_a_node_holding_this_trackers_sessions_is_believed() -> None:
    HEAD_QUEUES.sessions_opened(["full"])
    try:
        for now in (100.0, 200.0):
            failure = asyncio.run(busy_claim_judged(RouteBusy("full"), now=now, grace=GRACE))
            assert failure is None
    finally:
        HEAD_QUEUES.sessions_closed(["full"])


@pytest.mark.django_db(transaction=True)
def test_a_node_that_reported_sessions_is_believed_and_an_idle_one_is_not() -> None:
    model = make_model()
    make_node(model, "reported", 0, 3, active_sessions=2)
    make_node(model, "idle", 0, 3, active_sessions=0)

    def judged(node: str, now: float) -> str | None:
        failure = asyncio.run(busy_claim_judged(RouteBusy(node), now=now, grace=GRACE))
        return None if failure is None else failure.message

    assert [judged("reported", now) for now in (100.0, 200.0)] == [None, None]
    assert judged("idle", 100.0) is None  # waited for, for now
    failure = judged("idle", 100.0 + GRACE)
    assert failure == "node idle answered busy while idle for 10 s (false_busy)"
