"""The console ring, the per-request call summaries (the Call wall) and the route series.

The live push of these to dashboards is tested in tests/tracker/dashboard/test_consumer.py.
"""

from __future__ import annotations

from typing import Any

from tracker_app.completions import console
from tracker_app.completions.console import CallBook, ConsoleEvent, ConsoleRing, RouteSeries


def event(kind: str, request_id: str, at: float = 0.0, **data: Any) -> ConsoleEvent:
    return ConsoleEvent(kind=kind, request_id=request_id, data=data, at=at or 1000.0)


def test_progress_is_updated_in_place_and_the_ring_stays_bounded() -> None:
    ring = ConsoleRing(size=3)
    ring.add(event(console.ROUTE_SELECTED, "r1", mode="scout", signature="s"))
    for tokens in range(1, 50):
        ring.add(event(console.PROGRESS, "r1", tokens=tokens))

    assert [e.kind for e in ring.events()] == [console.ROUTE_SELECTED, console.PROGRESS]
    assert ring.events()[-1].data["tokens"] == 49

    for n in range(5):
        ring.add(event(console.COMPLETE, f"other-{n}"))
    assert len(ring.events()) == 3


def test_the_call_wall_shows_in_flight_requests_live_and_the_finished_ones() -> None:
    book = CallBook()
    book.apply(
        event(
            console.ROUTE_SELECTED,
            "busy",
            1,
            mode="exploit",
            signature="m | a[0-3]",
            api="messages",
        )
    )
    book.apply(event(console.CONNECTED, "busy", 2))
    book.apply(event(console.PROGRESS, "busy", 3, tokens=12, tokens_per_second=15.0, queue=0))
    book.apply(event(console.ROUTE_SELECTED, "done", 4, mode="scout", signature="m | b[0-3]"))
    book.apply(event(console.COMPLETE, "done", 5, completion_tokens=30, tokens_per_second=9.0))
    book.apply(event(console.ROUTE_SELECTED, "broken", 6, mode="pinned", signature="m | c[0-3]"))
    book.apply(event(console.ERROR, "broken", 7, message="hop c failed"))

    [busy] = book.in_flight()
    recent = book.finished(limit=20)

    assert busy["request_id"] == "busy" and busy["state"] == "processing"
    assert (busy["tokens"], busy["tokens_per_second"], busy["mode"]) == (12, 15.0, "exploit")
    assert busy["api"] == "messages"
    assert [c["request_id"] for c in recent] == ["broken", "done"]
    assert (recent[0]["state"], recent[0]["error"]) == ("failed", "hop c failed")
    assert (recent[1]["state"], recent[1]["tokens"]) == ("completed", 30)
    assert recent[1]["route"] == "m | b[0-3]"


def test_a_finished_request_never_goes_back_to_processing() -> None:
    book = CallBook()
    book.apply(event(console.COMPLETE, "r", 1, completion_tokens=5))

    call = book.apply(event(console.PROGRESS, "r", 2, tokens=1))

    assert (call["state"], call["tokens"]) == ("completed", 5)


def test_the_call_book_forgets_the_oldest_finished_requests_first() -> None:
    book = CallBook(size=3)
    book.apply(event(console.ROUTE_SELECTED, "still-running", 1))
    for n in range(4):
        book.apply(event(console.COMPLETE, f"done-{n}", 2 + n))

    assert [c["request_id"] for c in book.in_flight()] == ["still-running"]
    assert [c["request_id"] for c in book.finished(limit=20)] == ["done-3", "done-2"]


def test_the_route_series_keeps_the_last_minutes_of_each_routes_speed() -> None:
    series = RouteSeries(window=60, max_points=3)
    for n in range(5):
        series.record(model_key="m", signature="m | a", tokens_per_second=float(n), at=100.0 + n)
    series.record(model_key="m", signature="m | old", tokens_per_second=1.0, at=10.0)
    series.record(model_key="other", signature="other | x", tokens_per_second=1.0, at=100.0)

    assert series.for_model("m", now=130.0) == {"m | a": [[102.0, 2.0], [103.0, 3.0], [104.0, 4.0]]}
    assert series.for_model("m", now=1000.0) == {}
