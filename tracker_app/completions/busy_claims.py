"""Whether a node's "busy" holds up: a claim the tracker checks against what it knows.

A node that answers busy (a head's 503, or a ``hop_busy`` frame naming a hop
of the route) is waited for, not banned (ADR-0004, "Deadlines"). Taken on
its word, a node that always answers busy stalls every client that draws
its route for the whole busy deadline, and its route is never sampled, so
the choice keeps drawing it. So each claim is checked against what the
tracker knows of the node: the sessions this tracker's own streams hold on
it (:data:`~tracker_app.completions.head_queue.HEAD_QUEUES`: streams the node
answered, never ones only queued on it), and the sessions
the node itself reported in its last heartbeat (which counts other
trackers' sessions too). A claim with neither behind it is unexplained; a
node whose busy answers have stayed unexplained for longer than ``grace``
(two heartbeat intervals: an honestly full node reports its sessions within
one) is taken to lie, and the proxy bans it and fails over like any failed
node. An explained claim, or a token the node serves, ends its streak.

The streaks are this tracker process's, like the ban back-off counts
(:mod:`routing_app.exclusions.bans`); the bans they lead to reach every tracker.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from meshnet_site.database import database_call
from nodes_app.models import Node
from tracker_app.completions.head_queue import HEAD_QUEUES
from tracker_app.completions.head_stream import HopFailure, RouteBusy


class BusyClaims:
    """Per node: since when its busy answers have gone unexplained."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}
        self._lock = threading.Lock()

    def claim(self, node_id: str, *, explained: bool, now: float, grace: float) -> bool:
        """Count one busy answer of ``node_id``; True when its busy answers have gone
        unexplained for ``grace`` seconds or more: the claim is false."""
        with self._lock:
            if explained:
                self._since.pop(node_id, None)
                return False
            since = self._since.setdefault(node_id, now)
        return now - since >= grace

    def reset(self) -> None:
        """Forget every streak (tests start from a clean slate)."""
        with self._lock:
            self._since.clear()

    def served(self, node_ids: Iterable[str]) -> None:
        """The nodes served a token: whatever they claimed before is behind them."""
        if not self._since:  # the common case: nobody is claiming anything
            return
        with self._lock:
            for node_id in node_ids:
                self._since.pop(node_id, None)


def node_reported_sessions(*, node_id: str) -> int:
    """The sessions ``node_id`` reported in its last heartbeat (0 for a node unknown)."""
    sessions = Node.objects.filter(pk=node_id).values_list("active_sessions", flat=True).first()
    return sessions or 0


# The process's streaks; every proxy of this tracker shares them.
BUSY_CLAIMS = BusyClaims()


async def busy_claim_judged(busy: RouteBusy, *, now: float, grace: float) -> HopFailure | None:
    """Whether ``busy`` holds up: None to wait for a slot, or the failure of its node
    (``false_busy``) once nothing the tracker knows has explained its busy answers for
    ``grace`` seconds."""
    node = busy.node_id
    explained = HEAD_QUEUES.node_sessions(node) > 0
    if not explained:
        explained = await database_call(node_reported_sessions)(node_id=node) > 0
    if not BUSY_CLAIMS.claim(node, explained=explained, now=now, grace=grace):
        return None
    return HopFailure(node, f"node {node} answered busy while idle for {grace:g} s (false_busy)")
