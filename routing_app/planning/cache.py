"""The candidate cache (ADR-0018, "The cache"): ``enumerate_routes`` for repeated decisions."""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from routing_app.planning.route_plan import NodeRecord, RoutePlan, plan_rank, plan_rescored
from routing_app.planning.search import MAX_CANDIDATES, enumerate_routes

# A model's candidate routes are selected again at most this often while its topology
# (nodes, endpoints, shards, nodes avoided) stays the same (ADR-0018, "The cache"):
# between selections the routes are kept and only their priors and rank follow the
# nodes' current scores.
RESELECT_SECONDS = 1.0


class _Selection(NamedTuple):
    """One topology's candidates: the routes selected at ``selected_at``, planned for
    the nodes' score inputs ``scores`` (in node id order)."""

    selected_at: float
    # Whether ``plans`` are the enumeration's for ``scores`` (not kept routes rescored).
    exact: bool
    scores: tuple[tuple[float, float, int, int, float], ...]
    plans: tuple[RoutePlan, ...]


class CandidateCache:
    """``enumerate_routes`` for repeated decisions: the routes are selected again only
    when the topology changes or ``reselect_after`` seconds have passed (ADR-0018).

    The key is what makes a route possible: the model, its layers, the cap, the nodes
    avoided and every usable node's id, endpoint and shard. A node joining, leaving,
    moving its shard or being avoided (banned) is a new key, so the candidates follow
    at once. Node scores (queue depth, measured speed, reputation) change with every
    heartbeat and do not select the routes again before ``reselect_after``: the kept
    routes are planned with the current records (prior, per-hop seconds) and ranked
    again, best prior first; with the same scores the plans themselves are reused.
    Safe to share between threads.
    """

    def __init__(
        self,
        *,
        reselect_after: float = RESELECT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        size: int = 64,
    ) -> None:
        self.reselect_after = reselect_after
        self.clock = clock
        self.size = size
        self._selections: dict[tuple[Any, ...], _Selection] = {}
        self._lock = threading.Lock()

    def routes(
        self,
        *,
        model_key: str,
        num_layers: int,
        nodes: Iterable[NodeRecord],
        avoid: frozenset[str] = frozenset(),
        limit: int = MAX_CANDIDATES,
    ) -> list[RoutePlan]:
        """What ``enumerate_routes`` gives for these arguments, from the cache when the
        topology is the one last seen and its routes were selected recently."""
        records = sorted(nodes, key=_RECORD_ID)
        if avoid:  # bans of other models' nodes change nothing here
            avoid = avoid.intersection(map(_RECORD_ID, records))
        key = (model_key, num_layers, limit, avoid, tuple(map(_RECORD_SHAPE, records)))
        scores = tuple(map(_RECORD_SCORE, records))
        now = self.clock()
        with self._lock:
            kept = self._selections.get(key)
        fresh = kept is not None and now - kept.selected_at < self.reselect_after
        if kept is not None and kept.scores == scores and (fresh or kept.exact):
            return list(kept.plans)
        if kept is not None and fresh:
            by_id = {node.node_id: node for node in records}
            plans = sorted(
                (plan_rescored(plan, [by_id[i] for i in plan.node_ids]) for plan in kept.plans),
                key=plan_rank,
            )
            selection = kept._replace(exact=False, scores=scores, plans=tuple(plans))
        else:
            plans = enumerate_routes(
                model_key=model_key, num_layers=num_layers, nodes=records, avoid=avoid, limit=limit
            )
            selection = _Selection(now, True, scores, tuple(plans))
        with self._lock:
            self._selections.pop(key, None)
            self._selections[key] = selection
            while len(self._selections) > self.size:
                del self._selections[next(iter(self._selections))]
        return plans


# What a record's place in routes depends on, and what its score is computed from.
_RECORD_ID = operator.attrgetter("node_id")
_RECORD_SHAPE = operator.attrgetter("node_id", "endpoint", "shard_start", "shard_end")
_RECORD_SCORE = operator.attrgetter(
    "benchmark_tps", "measured_tps", "queue_depth", "active_sessions", "reputation"
)
