"""The requests this tracker streams from each head, and the sessions it holds on each
node: a request's queue on the dashboard, and what explains a node's busy answer."""

from __future__ import annotations

from tracker_app.completions.head_queue import HeadQueues

HEAD = "http://head:8001"


def test_a_request_waits_behind_the_other_requests_at_its_head_not_its_own_choices() -> None:
    queues = HeadQueues()
    queues.joined(HEAD, "mine")
    queues.joined(HEAD, "mine")  # a second choice of the same request
    queues.joined(HEAD, "other")
    queues.joined("http://elsewhere:8001", "third")

    assert queues.ahead(HEAD, "mine") == 1
    assert queues.ahead(HEAD, "other") == 1
    assert queues.ahead("http://idle:8001", "mine") == 0


def test_a_request_leaves_the_queue_when_its_last_stream_there_ends() -> None:
    queues = HeadQueues()
    queues.joined(HEAD, "mine")
    queues.joined(HEAD, "mine")
    queues.joined(HEAD, "other")

    queues.left(HEAD, "mine")
    assert queues.ahead(HEAD, "other") == 1
    queues.left(HEAD, "mine")
    assert queues.ahead(HEAD, "other") == 0


def test_only_sessions_a_node_holds_are_counted_and_every_one_closed_is_forgotten() -> None:
    queues = HeadQueues()
    queues.joined(HEAD, "queued")  # only queued there: no session yet

    queues.sessions_opened(["head", "tail"])
    queues.sessions_opened(["head"])

    assert (queues.node_sessions("head"), queues.node_sessions("tail")) == (2, 1)
    queues.sessions_closed(["head", "tail"])
    queues.sessions_closed(["head"])
    assert (queues.node_sessions("head"), queues.node_sessions("tail")) == (0, 0)
