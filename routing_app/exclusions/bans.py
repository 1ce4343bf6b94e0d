"""Bans of nodes that failed mid-generation: how long each is kept out (exponential back-off).

A node that fails is banned in the route store's exclusions (so the planner
routes around it, on every tracker once Redis carries it; see
``routing_app.exclusions.kept_out`` for bans and quarantines) for 30 s × 2^(n−1) after
its n-th consecutive failure, capped at 15 minutes; a completed request
clears the count of every node on its route. The count itself is this
tracker process's (ADR-0004).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from routing_app.learning.stats import RouteStatsStore
from routing_app.learning.tracker_store import route_stats_store

BAN_BASE_SECONDS = 30.0
BAN_MAX_SECONDS = 15 * 60.0


class NodeBans:
    """Consecutive failures per node and the ban each earns: 30 s, 60 s, 120 s… capped."""

    def __init__(
        self, *, base_seconds: float = BAN_BASE_SECONDS, max_seconds: float = BAN_MAX_SECONDS
    ) -> None:
        self.base_seconds = base_seconds
        self.max_seconds = max_seconds
        self._failures: dict[str, int] = {}
        self._lock = threading.Lock()

    def fail(self, node_id: str) -> float:
        """Count one more failure of ``node_id``; the seconds of ban it earns."""
        with self._lock:
            count = self._failures.get(node_id, 0) + 1
            self._failures[node_id] = count
        return min(self.max_seconds, self.base_seconds * 2 ** (count - 1))

    def clear(self, node_ids: Iterable[str]) -> None:
        with self._lock:
            for node_id in node_ids:
                self._failures.pop(node_id, None)

    def failures(self, node_id: str) -> int:
        with self._lock:
            return self._failures.get(node_id, 0)


# The process's back-off counts; every proxy of this tracker shares them.
_bans = NodeBans()


def node_ban(
    *, node_id: str, bans: NodeBans | None = None, store: RouteStatsStore | None = None
) -> float:
    """Ban ``node_id`` for its next back-off step; returns the seconds of the ban."""
    seconds = (bans or _bans).fail(node_id)
    (store or route_stats_store()).exclusions.ban_node(node_id=node_id, seconds=seconds)
    return seconds


def node_bans_clear(*, node_ids: Iterable[str], bans: NodeBans | None = None) -> None:
    """Forget the failures of ``node_ids`` (their route just completed a request).

    A ban still running is left to lapse: the planner already routes around
    the node until then.
    """
    (bans or _bans).clear(node_ids)
