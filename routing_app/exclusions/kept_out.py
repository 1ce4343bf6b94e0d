"""Keeping nodes and routes out of the choice: bans and quarantines.

One word per thing kept out:

- A **ban** keeps a *node* out for a time. A node that failed mid-generation
  is banned for 30 s × 2^(n−1) after its n-th failure in a row, at most
  15 minutes (``routing_app.exclusions.bans`` counts the failures; a completed request
  clears the count). The planner routes around a banned node, and the ban
  lapses by itself.
- A **quarantine** keeps a *route* (model, signature) out. The probe
  quarantines a route whose answer disagreed with the reference
  (``routing_app.exclusions.probe_verdicts``, a ``RouteQuarantine`` row) until a later probe
  agrees and releases it; every tracker reads the active ones at its sync
  (``routing_app.learning.sync``). ``quarantine_route`` sets one for a time instead,
  which lapses like a ban.

A route kept out either way stays listed in ``/v1/routing`` with status
``quarantined`` (the API's one word for it: its route is quarantined, or one
of its nodes is banned) and is never chosen; when every candidate is kept
out, the choice answers 503 ``no_route``. Neither touches the registry: a
node that staff banned there (``NodeStatus.BANNED``) is not online and takes
no route at all.

Each tracker bans and quarantines for a time on its own evidence, publishes
those to its peers with its arms and honours theirs until they lapse (the
probe's quarantines come from the database, not from peers).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from routing_app.learning.arms import ArmKey, Clock
from routing_app.planning.route_plan import RoutePlan


def _drop_lapsed(until_by_key: dict[Any, float], now: float) -> None:
    for key in [key for key, until in until_by_key.items() if until <= now]:
        del until_by_key[key]


def _set_until(until_by_key: dict[Any, float], key: Any, until: float, seconds: float) -> None:
    if seconds > 0:
        until_by_key[key] = until
    else:
        until_by_key.pop(key, None)


class Exclusions:
    """The nodes banned and the routes quarantined, as one tracker process knows them.

    Thread-safe: the proxy bans while the choice reads and the sync thread
    exchanges them with the peers.
    """

    def __init__(self, *, clock: Clock = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._bans: dict[str, float] = {}  # node id -> banned until
        self._quarantines: dict[ArmKey, float] = {}  # route -> quarantined until
        # What the other trackers published, as of the last sync.
        self._peer_bans: dict[str, float] = {}
        self._peer_quarantines: dict[ArmKey, float] = {}
        # Routes the probe quarantined, as the database said at the last sync.
        self._probe_quarantines: frozenset[ArmKey] = frozenset()

    def ban_node(self, *, node_id: str, seconds: float) -> None:
        """Keep every route through this node out of the choice for ``seconds``.

        For a node that failed mid-generation: the planner routes around it
        and the routes that contain it show as quarantined. A later call
        replaces the time; ``seconds`` <= 0 lifts the ban.
        """
        until = self.clock() + seconds
        with self._lock:
            _set_until(self._bans, node_id, until, seconds)

    def quarantine_route(self, *, model_key: str, signature: str, seconds: float) -> None:
        """Keep this route out of every choice for ``seconds``.

        It stays listed, with status quarantined; a later call extends or
        shortens the quarantine; ``seconds`` <= 0 lifts it.
        """
        until = self.clock() + seconds
        with self._lock:
            _set_until(self._quarantines, (model_key, signature), until, seconds)

    def set_probe_quarantines(self, routes: Iterable[ArmKey]) -> None:
        """Replace the routes the probe quarantines (read from the database).

        They stay listed with status quarantined and are never chosen until a
        later call leaves them out (the probe released them).
        """
        quarantined = frozenset(routes)
        with self._lock:
            self._probe_quarantines = quarantined

    def banned_nodes(self) -> frozenset[str]:
        """Ids of the nodes banned now, here or at a peer tracker."""
        now = self.clock()
        with self._lock:
            return self._banned(now)

    def kept_out(self, plans: Sequence[RoutePlan]) -> list[bool]:
        """Per plan: whether it is kept out now (quarantined, or through a banned node)."""
        now = self.clock()
        with self._lock:
            banned = self._banned(now)
            return [
                (key := (plan.model_key, plan.signature)) in self._probe_quarantines
                or max(self._quarantines.get(key, 0.0), self._peer_quarantines.get(key, 0.0)) > now
                or any(node_id in banned for node_id in plan.node_ids)
                for plan in plans
            ]

    def _banned(self, now: float) -> frozenset[str]:
        banned = {node for node, until in self._bans.items() if until > now}
        banned.update(node for node, until in self._peer_bans.items() if until > now)
        return frozenset(banned)

    def drop_lapsed(self) -> None:
        """Forget this tracker's bans and quarantines whose time is up."""
        now = self.clock()
        with self._lock:
            _drop_lapsed(self._quarantines, now)
            _drop_lapsed(self._bans, now)

    def export(self) -> dict[str, list[list[Any]]]:
        """This tracker's own timed bans and quarantines (never its peers'), for its peers."""
        with self._lock:
            return {
                "routes_quarantined": [[k[0], k[1], u] for k, u in self._quarantines.items()],
                "nodes_banned": [[node, until] for node, until in self._bans.items()],
            }

    def absorb(self, payloads: Iterable[Mapping[str, Any]]) -> None:
        """Replace the peers' bans and quarantines with these (each peer's ``export``)."""
        quarantines: dict[ArmKey, float] = {}
        bans: dict[str, float] = {}
        for payload in payloads:
            for model_key, signature, until in payload.get("routes_quarantined", []):
                key = (str(model_key), str(signature))
                quarantines[key] = max(quarantines.get(key, 0.0), float(until))
            for node_id, until in payload.get("nodes_banned", []):
                bans[str(node_id)] = max(bans.get(str(node_id), 0.0), float(until))
        with self._lock:
            self._peer_quarantines = quarantines
            self._peer_bans = bans
