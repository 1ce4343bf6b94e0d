"""What the tracker has learned about each route's real speed (ADR-0021).

Per (model, signature) the store keeps an ``ArmState``: an EWMA of observed
end-to-end tokens/s, the sample mass behind it (decaying with a half-life),
the time that mass refers to, the topology epoch it was measured under and a
plain sample count. Because the state is (value, mass, time), two states of
the same arm combine by decayed weight, which is how trackers merge what
they learned (``routing_app.redis_merge``) without a consensus protocol.

The store is thread-safe: the chat proxy records samples and the choice
reads arms while a background thread syncs with the database and Redis.
It never touches a database or a network itself: an ``ArmArchive`` (the
durable copy, ``routing_app.durable``) and an ``ArmExchange`` (the Redis
merge) are plugged in, and ``sync()`` is the only call that uses them.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from routing_app.config import RoutingConfig
from routing_app.planner import RoutePlan

Clock = Callable[[], float]

# Decayed mass an arm needs to be exploited; below it the arm is re-scouted.
PROVEN_MASS = 0.5
# A pruned arm's tombstone is kept this long, so a peer's publication that
# still carries the arm (it has not synced since the prune) does not bring it
# back; by then every live peer has republished without it.
TOMBSTONE_SECONDS = 600.0
# Times travel through the database as datetimes: allow their rounding.
SAME_TIME = 1e-3
# The least weight a new sample gets in the EWMA. Without a floor an arm that
# collected hundreds of samples within a half-life would need about a
# half-life to follow a real change of speed (a node slowing down); with it a
# change shows within a few samples, while a quiet arm (decayed mass) still
# lets a single new sample count for more.
SAMPLE_WEIGHT_FLOOR = 0.2

ArmKey = tuple[str, str]  # (model key, signature)


class ArmStatus(StrEnum):
    PROVEN = "proven"
    UNSAMPLED = "unsampled"
    STALE = "stale"
    DECAYED = "decayed"
    QUARANTINED = "quarantined"


def sample_added(value: float, mass: float, sample: float) -> tuple[float, float]:
    """An arm's EWMA ``value`` and decayed ``mass`` after one more sample of ``sample``
    tokens/s: a new sample weighs 1/(mass + 1), at least ``SAMPLE_WEIGHT_FLOOR``."""
    weight = max(1.0 / (mass + 1.0), SAMPLE_WEIGHT_FLOOR)
    return value + weight * (sample - value), mass + 1.0


def decay_factor(elapsed: float, half_life: float) -> float:
    """How much of a sample's weight is left after ``elapsed`` seconds."""
    return 0.5 ** (max(elapsed, 0.0) / half_life)


@dataclass(frozen=True, slots=True)
class ArmState:
    """One arm's learned speed: ``mass`` is the decayed sample mass at time ``at``."""

    value: float
    mass: float
    at: float
    epoch: int
    samples: int

    def mass_at(self, now: float, half_life: float) -> float:
        return self.mass * decay_factor(now - self.at, half_life)

    def merged(self, other: ArmState, half_life: float) -> ArmState:
        """Both states as one: a newer epoch supersedes, equal epochs mix by decayed mass."""
        if self.epoch != other.epoch:
            return self if self.epoch > other.epoch else other
        at = max(self.at, other.at)
        mine, theirs = self.mass_at(at, half_life), other.mass_at(at, half_life)
        total = mine + theirs
        if total <= 0.0:  # both fully decayed: the later one, or the mean of a tie
            if self.at == other.at:
                value = (self.value + other.value) / 2
            else:
                value = self.value if self.at > other.at else other.value
        else:
            value = (mine * self.value + theirs * other.value) / total
        return ArmState(value, total, at, self.epoch, self.samples + other.samples)

    def to_row(self, key: ArmKey) -> list[Any]:
        return [key[0], key[1], self.value, self.mass, self.at, self.epoch, self.samples]

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> tuple[ArmKey, ArmState]:
        model_key, signature, value, mass, at, epoch, samples = row
        state = cls(float(value), float(mass), float(at), int(epoch), int(samples))
        return (str(model_key), str(signature)), state


@dataclass(frozen=True, slots=True)
class ArmView:
    """One candidate as the policy and ``/v1/routing`` see it right now."""

    plan: RoutePlan
    status: ArmStatus
    tps: float | None
    weight: float
    samples: int
    # Seconds since the arm's latest sample (None: never sampled), for the bound on
    # how long a candidate may go unmeasured (ADR-0011).
    last_sample_age: float | None = None

    @property
    def current_weight(self) -> float:
        """Decayed mass measured under the current topology (0 for stale arms)."""
        return 0.0 if self.status in (ArmStatus.STALE, ArmStatus.UNSAMPLED) else self.weight


def least_measured(arms: Sequence[ArmView], pool: Iterable[int]) -> int | None:
    """The index in ``pool`` of the arm to scout first: the least mass measured under
    the current topology, then the higher prior, then the earlier arm (both policies)."""
    return min(
        pool, key=lambda i: (arms[i].current_weight, -arms[i].plan.prior_tps, i), default=None
    )


def _drop_lapsed(holds: dict[Any, float], now: float) -> None:
    for key in [key for key, until in holds.items() if until <= now]:
        del holds[key]


class ArmExchange(Protocol):
    """Publishes this store's own state and returns every other store's (see redis_merge)."""

    def exchange(self, payload: dict[str, Any]) -> list[dict[str, Any]]: ...


@dataclass(frozen=True, slots=True)
class PrunedState:
    """The prune job deleted this arm's durable copy, measured up to ``last_sample_at``.

    ``own``: the copy was this tracker's; otherwise it was a peer's.
    """

    key: ArmKey
    last_sample_at: float
    own: bool


@dataclass(frozen=True, slots=True)
class ArchiveNews:
    """What the durable copy tells a tracker at a sync: prunes and probe quarantines."""

    pruned: Sequence[PrunedState] = ()
    quarantined: frozenset[ArmKey] = frozenset()


class ArmArchive(Protocol):
    """This store's durable copy (see ``routing_app.durable``)."""

    def restore(self) -> list[tuple[ArmKey, ArmState]]:
        """The arms this tracker had written before it (re)started."""
        ...

    def exchange(self, changed: Sequence[tuple[ArmKey, ArmState]]) -> ArchiveNews:
        """Write ``changed`` (this tracker's arms that took samples since the last
        call); return what was pruned since the last call and what is quarantined."""
        ...


class RouteStatsStore:
    """Learned route speeds of one tracker process, optionally merged with its peers'."""

    def __init__(
        self,
        *,
        half_life: float = 600.0,
        min_sample_tokens: int = 8,
        clock: Clock = time.time,
        exchange: ArmExchange | None = None,
        archive: ArmArchive | None = None,
    ) -> None:
        if half_life <= 0:
            raise ValueError("half_life must be positive")
        self.half_life = half_life
        self.min_sample_tokens = min_sample_tokens
        self.clock = clock
        self.exchange = exchange
        self.archive = archive
        self._lock = threading.Lock()
        self._arms: dict[ArmKey, ArmState] = {}
        self._routes_held: dict[ArmKey, float] = {}
        self._nodes_held: dict[str, float] = {}
        # What the other trackers published, as of the last sync.
        self._remote_arms: dict[ArmKey, ArmState] = {}
        self._remote_routes_held: dict[ArmKey, float] = {}
        self._remote_nodes_held: dict[str, float] = {}
        # Own arms that took samples since the archive last wrote them.
        self._dirty: set[ArmKey] = set()
        # Routes the probe quarantined, as the archive said at the last sync.
        self._probe_held: frozenset[ArmKey] = frozenset()
        # key -> (last sample time of the pruned state, when the prune was learned)
        self._tombstones: dict[ArmKey, tuple[float, float]] = {}

    @classmethod
    def from_config(cls, config: RoutingConfig, **kwargs: Any) -> RouteStatsStore:
        return cls(
            half_life=config.stats_half_life,
            min_sample_tokens=config.min_sample_tokens,
            **kwargs,
        )

    # --- samples -------------------------------------------------------------

    def record_sample(
        self,
        *,
        model_key: str,
        signature: str,
        epoch: int,
        output_tokens: int,
        tokens_per_second: float,
    ) -> bool:
        """Learn from one finished request; returns whether the sample was kept.

        Rejected: fewer than ``min_sample_tokens`` output tokens (a near-empty
        completion's speed means nothing, ADR-0020), a speed that is not a
        positive number, and a sample from an older epoch than the arm's. The
        first sample of a newer epoch restarts the arm from that sample.
        """
        if output_tokens < self.min_sample_tokens:
            return False
        if not math.isfinite(tokens_per_second) or tokens_per_second <= 0:
            return False
        key = (model_key, signature)
        now = self.clock()
        with self._lock:
            arm = self._arms.get(key)
            if arm is None or arm.epoch < epoch:
                self._arms[key] = ArmState(tokens_per_second, 1.0, now, epoch, 1)
                self._dirty.add(key)
                return True
            if arm.epoch > epoch:
                return False
            value, mass = sample_added(
                arm.value, arm.mass_at(now, self.half_life), tokens_per_second
            )
            self._arms[key] = ArmState(value, mass, max(now, arm.at), epoch, arm.samples + 1)
            self._dirty.add(key)
        return True

    def arm(self, *, model_key: str, signature: str) -> ArmState | None:
        """The arm as this tracker sees it: its own samples merged with its peers'."""
        with self._lock:
            return self._merged((model_key, signature))

    def _merged(self, key: ArmKey) -> ArmState | None:
        local, remote = self._arms.get(key), self._remote_arms.get(key)
        if local is None or remote is None:
            return local or remote
        return local.merged(remote, self.half_life)

    def views(self, *, plans: Sequence[RoutePlan], epoch: int) -> list[ArmView]:
        """Each plan's arm under the current ``epoch``, in the order given."""
        now = self.clock()
        with self._lock:
            held_nodes = self._held_nodes(now)
            views = []
            for plan in plans:
                key = (plan.model_key, plan.signature)
                state = self._merged(key)
                views.append(self._view(plan, state, epoch, now, held_nodes))
        return views

    def _view(
        self,
        plan: RoutePlan,
        state: ArmState | None,
        epoch: int,
        now: float,
        held_nodes: frozenset[str],
    ) -> ArmView:
        key = (plan.model_key, plan.signature)
        held = (
            key in self._probe_held
            or self._route_held_until(key) > now
            or any(node_id in held_nodes for node_id in plan.node_ids)
        )
        age: float | None = None
        if state is None or state.samples == 0:
            status = ArmStatus.UNSAMPLED
            tps, weight, samples = None, 0.0, 0
        else:
            tps, samples = state.value, state.samples
            age = max(now - state.at, 0.0)
            weight = state.mass_at(now, self.half_life)
            if state.epoch < epoch:
                status = ArmStatus.STALE
            elif weight < PROVEN_MASS:
                status = ArmStatus.DECAYED
            else:
                status = ArmStatus.PROVEN
        if held:
            status = ArmStatus.QUARANTINED
        return ArmView(plan, status, tps, weight, samples, age)

    # --- quarantine ----------------------------------------------------------

    def quarantine_route(self, *, model_key: str, signature: str, seconds: float) -> None:
        """Keep this route out of every choice for ``seconds`` (e.g. a probe found it corrupt).

        It stays listed, with status quarantined; a later call extends or
        shortens the hold; ``seconds`` <= 0 lifts it.
        """
        self._hold(self._routes_held, (model_key, signature), seconds)

    def quarantine_node(self, *, node_id: str, seconds: float) -> None:
        """Keep every route through this node out of the choice for ``seconds``.

        For a node that failed mid-generation: the planner routes around it
        and the routes that contain it show as quarantined.
        """
        self._hold(self._nodes_held, node_id, seconds)

    def _hold(self, table: dict[Any, float], key: Any, seconds: float) -> None:
        until = self.clock() + seconds
        with self._lock:
            if seconds > 0:
                table[key] = until
            else:
                table.pop(key, None)

    def quarantined_nodes(self) -> frozenset[str]:
        """Ids of the nodes under quarantine now, here or at a peer tracker."""
        now = self.clock()
        with self._lock:
            return self._held_nodes(now)

    def _held_nodes(self, now: float) -> frozenset[str]:
        held = {node for node, until in self._nodes_held.items() if until > now}
        held.update(node for node, until in self._remote_nodes_held.items() if until > now)
        return frozenset(held)

    def _route_held_until(self, key: ArmKey) -> float:
        return max(self._routes_held.get(key, 0.0), self._remote_routes_held.get(key, 0.0))

    # --- durability, housekeeping and merging ---------------------------------

    def restore(self) -> int:
        """Take back the arms this tracker wrote to its archive before it restarted.

        Arms it already holds are kept as they are. Returns how many were
        restored; without an archive, 0.
        """
        if self.archive is None:
            return 0
        restored = self.archive.restore()
        with self._lock:
            fresh = [(key, state) for key, state in restored if key not in self._arms]
            self._arms.update(fresh)
        return len(fresh)

    def forget_pruned(self, pruned: Iterable[PrunedState]) -> int:
        """Drop the arms the prune job deleted, unless sampled since; returns how many
        of this tracker's own arms were dropped.

        A peer's pruned state is dropped from the merged-in picture and kept out
        of it for ``TOMBSTONE_SECONDS`` (its publication may still carry it).
        """
        now = self.clock()
        dropped = 0
        with self._lock:
            for record in pruned:
                if record.own:
                    arm = self._arms.get(record.key)
                    if arm is not None and arm.at <= record.last_sample_at + SAME_TIME:
                        del self._arms[record.key]
                        self._dirty.discard(record.key)
                        dropped += 1
                remote = self._remote_arms.get(record.key)
                if remote is not None and remote.at <= record.last_sample_at + SAME_TIME:
                    del self._remote_arms[record.key]
                known = self._tombstones.get(record.key)
                if known is None or known[0] < record.last_sample_at:
                    self._tombstones[record.key] = (record.last_sample_at, now)
        return dropped

    def hold_probed(self, routes: Iterable[ArmKey]) -> None:
        """Replace the set of routes the probe holds in quarantine (read from the archive).

        They stay listed with status quarantined and are never chosen until a
        later call leaves them out (the probe released them).
        """
        held = frozenset(routes)
        with self._lock:
            self._probe_held = held

    def _housekeep(self) -> None:
        """Drop lapsed holds and old tombstones (the arms are pruned by the prune job)."""
        now = self.clock()
        with self._lock:
            _drop_lapsed(self._routes_held, now)
            _drop_lapsed(self._nodes_held, now)
            for key in [
                k for k, (_, at) in self._tombstones.items() if at + TOMBSTONE_SECONDS < now
            ]:
                del self._tombstones[key]

    def _take_dirty(self) -> list[tuple[ArmKey, ArmState]]:
        with self._lock:
            changed = [(key, self._arms[key]) for key in self._dirty if key in self._arms]
            self._dirty.clear()
        return changed

    def _archive_sync(self, archive: ArmArchive) -> None:
        changed = self._take_dirty()
        try:
            news = archive.exchange(changed)
        except Exception:
            with self._lock:  # written next time, unless pruned meanwhile
                self._dirty.update(key for key, _ in changed if key in self._arms)
            raise
        self.forget_pruned(news.pruned)
        self.hold_probed(news.quarantined)

    def export(self) -> dict[str, Any]:
        """This tracker's own state (never what it merged in), for its peers."""
        with self._lock:
            return {
                "arms": [arm.to_row(key) for key, arm in self._arms.items()],
                "routes_held": [[k[0], k[1], until] for k, until in self._routes_held.items()],
                "nodes_held": [[node, until] for node, until in self._nodes_held.items()],
            }

    def absorb(self, payloads: Iterable[dict[str, Any]]) -> None:
        """Replace the peers' part of the picture with ``payloads`` (their exports).

        States the prune job deleted (see ``forget_pruned``) are left out.
        """
        with self._lock:
            tombstones = dict(self._tombstones)
        arms: dict[ArmKey, ArmState] = {}
        routes_held: dict[ArmKey, float] = {}
        nodes_held: dict[str, float] = {}
        for payload in payloads:
            for row in payload.get("arms", []):
                key, state = ArmState.from_row(row)
                tomb = tombstones.get(key)
                if tomb is not None and state.at <= tomb[0] + SAME_TIME:
                    continue
                known = arms.get(key)
                arms[key] = state if known is None else known.merged(state, self.half_life)
            for model_key, signature, until in payload.get("routes_held", []):
                key = (str(model_key), str(signature))
                routes_held[key] = max(routes_held.get(key, 0.0), float(until))
            for node_id, until in payload.get("nodes_held", []):
                nodes_held[str(node_id)] = max(nodes_held.get(str(node_id), 0.0), float(until))
        with self._lock:
            self._remote_arms = arms
            self._remote_routes_held = routes_held
            self._remote_nodes_held = nodes_held

    def sync(self) -> None:
        """Write this tracker's changed arms to the archive and take in its news (prunes,
        probe quarantines), then publish to and merge with the peers (with Redis).

        Blocking (database and network I/O): call it from a thread, e.g.
        ``await asyncio.to_thread(store.sync)``; ``routing_app.tracker_store``
        runs it periodically in a daemon thread. A failing archive does not stop
        the Redis merge; the first error is raised after both were tried.
        """
        self._housekeep()
        failure: Exception | None = None
        if self.archive is not None:
            try:
                self._archive_sync(self.archive)
            except Exception as error:
                failure = error
        if self.exchange is not None:
            self.absorb(self.exchange.exchange(self.export()))
        if failure is not None:
            raise failure

    async def sync_async(self) -> None:
        """``sync()`` in a worker thread, for a caller on an asyncio loop."""
        await asyncio.to_thread(self.sync)
