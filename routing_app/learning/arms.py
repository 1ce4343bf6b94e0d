"""What the tracker has learned about each route's real speed: the arms (ADR-0021).

Per (model, signature) ``RouteArms`` keeps an ``ArmState``: an EWMA of
observed end-to-end tokens/s, the sample mass behind it (decaying with a
half-life), the time that mass refers to, the topology epoch it was measured
under and a plain sample count. Because the state is (value, mass, time), two
states of the same arm combine by decayed weight, which is how trackers merge
what they learned (``routing_app.learning.sync``) without a consensus protocol.

How far one request's speed strays from its route's is learned beside them,
one ``SampleSpread`` per model, from the residuals of this tracker's samples:
it says how much one sample is worth to the policy (ADR-0011 §3).

``RouteArms`` holds this tracker's own arms (what it measured itself) apart
from its peers' (what the last sync merged in), so it can publish only its
own and never count a sample twice. It is thread-safe: the chat proxy records
samples and the choice reads arms while the sync thread exchanges them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from routing_app.planning.route_plan import RoutePlan

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
# With that floor w, however much mass an arm holds its value averages about
# (2 - w) / w samples: no belief may narrow past what that many samples justify.
EFFECTIVE_SAMPLES_CAP = (2.0 - SAMPLE_WEIGHT_FLOOR) / SAMPLE_WEIGHT_FLOOR
# How far one request's speed strays from its route's (the spread of ln tok/s) before
# the tracker has learned it from its own samples (``SampleSpread``): tens of percent
# (0.3: ±35 %), as prompt length, sampling and neighbours move it.
DEFAULT_SAMPLE_SPREAD = 0.3
# A learned spread stays within these: never so sure that routes a few percent apart
# stop sharing traffic, never so unsure that samples stop counting.
SAMPLE_SPREAD_BOUNDS = (0.1, 0.6)
# Residuals a model's spread is learned from before it replaces the default.
SPREAD_MIN_RESIDUALS = 8
# The least weight a new residual gets: the estimate follows about the last 60, so a
# change of speed (a slowed node's samples stray far) widens it within a few requests.
SPREAD_WEIGHT_FLOOR = 1.0 / 32

ArmKey = tuple[str, str]  # (model key, signature)


class ArmStatus(StrEnum):
    PROVEN = "proven"
    UNSAMPLED = "unsampled"
    STALE = "stale"
    DECAYED = "decayed"
    # Kept out of the choice (``routing_app.exclusions.kept_out``): the route is
    # quarantined, or one of its nodes is banned.
    QUARANTINED = "quarantined"


def sample_added(value: float, mass: float, sample: float) -> tuple[float, float]:
    """An arm's EWMA ``value`` and decayed ``mass`` after one more sample of ``sample``
    tokens/s: a new sample weighs 1/(mass + 1), at least ``SAMPLE_WEIGHT_FLOOR``."""
    weight = max(1.0 / (mass + 1.0), SAMPLE_WEIGHT_FLOOR)
    return value + weight * (sample - value), mass + 1.0


@dataclass(frozen=True, slots=True)
class SampleSpread:
    """How far one request's speed strays from its route's, learned per model.

    Each kept sample of an arm already measured under the same epoch is a residual:
    ln(sample / the arm's value). The arm's value is itself an average of about
    ``n`` samples, so a residual's expected square is spread² × (1 + 1/n); the
    estimate is an EWMA of squared residuals corrected by that factor. Routes of one
    model see the same requests, so one spread per model learns from all of them.
    """

    variance: float = DEFAULT_SAMPLE_SPREAD**2
    residuals: int = 0

    def added(self, residual: float, arm_samples: float) -> SampleSpread:
        """The estimate after one more ``residual`` against a value averaging
        ``arm_samples`` samples."""
        squared = residual**2 / (1.0 + 1.0 / arm_samples)
        weight = max(1.0 / (self.residuals + 1.0), SPREAD_WEIGHT_FLOOR)
        return SampleSpread(self.variance + weight * (squared - self.variance), self.residuals + 1)

    @property
    def spread(self) -> float:
        """The learned spread within ``SAMPLE_SPREAD_BOUNDS``; the default until
        ``SPREAD_MIN_RESIDUALS`` residuals are in."""
        if self.residuals < SPREAD_MIN_RESIDUALS:
            return DEFAULT_SAMPLE_SPREAD
        low, high = SAMPLE_SPREAD_BOUNDS
        return min(max(math.sqrt(self.variance), low), high)


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
    # Seconds since the arm's latest sample (unsampled: since this tracker first listed
    # it; None: unknown), for the bound on how long a candidate may go unmeasured
    # (ADR-0011, ADR-0018).
    last_sample_age: float | None = None
    # How far one request's speed strays from its route's (ln tok/s), as this tracker
    # learned it for the model (``SampleSpread``).
    sample_spread: float = DEFAULT_SAMPLE_SPREAD

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


@dataclass(frozen=True, slots=True)
class PrunedState:
    """The prune job deleted this arm's durable copy, measured up to ``last_sample_at``.

    ``own``: the copy was this tracker's; otherwise it was a peer's.
    """

    key: ArmKey
    last_sample_at: float
    own: bool


class RouteArms:
    """Learned route speeds of one tracker process: its own arms and its peers'."""

    def __init__(
        self, *, half_life: float = 600.0, min_sample_tokens: int = 8, clock: Clock = time.time
    ) -> None:
        if half_life <= 0:
            raise ValueError("half_life must be positive")
        self.half_life = half_life
        self.min_sample_tokens = min_sample_tokens
        self.clock = clock
        self._lock = threading.Lock()
        self._own: dict[ArmKey, ArmState] = {}
        # What the other trackers published, as of the last sync.
        self._peers: dict[ArmKey, ArmState] = {}
        # Own arms that took samples since the archive last wrote them.
        self._unwritten: set[ArmKey] = set()
        # key -> (last sample time of the pruned state, when the prune was learned)
        self._tombstones: dict[ArmKey, tuple[float, float]] = {}
        # Unsampled arms -> when this tracker first listed them as candidates.
        self._listed: dict[ArmKey, float] = {}
        # Model key -> the spread of its requests' speeds, from this tracker's samples.
        self._spreads: dict[str, SampleSpread] = {}

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
        first sample of a newer epoch restarts the arm from that sample. A kept
        sample of an arm already measured under its epoch (at least one sample's
        decayed mass, own and peers' merged) also teaches the model's
        ``SampleSpread``.
        """
        if output_tokens < self.min_sample_tokens:
            return False
        if not math.isfinite(tokens_per_second) or tokens_per_second <= 0:
            return False
        key = (model_key, signature)
        now = self.clock()
        with self._lock:
            self._listed.pop(key, None)
            known = self._merged(key)
            if known is not None and known.epoch == epoch:
                mass = known.mass_at(now, self.half_life)
                if mass >= 1.0:  # kept speeds are positive, so the value is too
                    spread = self._spreads.get(model_key, SampleSpread())
                    self._spreads[model_key] = spread.added(
                        math.log(tokens_per_second / known.value),
                        min(mass, EFFECTIVE_SAMPLES_CAP),
                    )
            arm = self._own.get(key)
            if arm is None or arm.epoch < epoch:
                self._own[key] = ArmState(tokens_per_second, 1.0, now, epoch, 1)
                self._unwritten.add(key)
                return True
            if arm.epoch > epoch:
                return False
            value, mass = sample_added(
                arm.value, arm.mass_at(now, self.half_life), tokens_per_second
            )
            self._own[key] = ArmState(value, mass, max(now, arm.at), epoch, arm.samples + 1)
            self._unwritten.add(key)
        return True

    def arm(self, *, model_key: str, signature: str) -> ArmState | None:
        """The arm as this tracker sees it: its own samples merged with its peers'."""
        with self._lock:
            return self._merged((model_key, signature))

    def states(self, keys: Iterable[ArmKey]) -> list[ArmState | None]:
        """Each key's merged state (``arm``), read under one lock."""
        with self._lock:
            return [self._merged(key) for key in keys]

    def _merged(self, key: ArmKey) -> ArmState | None:
        own, peer = self._own.get(key), self._peers.get(key)
        if own is None or peer is None:
            return own or peer
        return own.merged(peer, self.half_life)

    def sample_spread(self, model_key: str) -> float:
        """How far one of ``model_key``'s requests strays from its route's speed (ln tok/s):
        learned from this tracker's samples, the default before enough of them."""
        with self._lock:
            return self._spreads.get(model_key, SampleSpread()).spread

    def view(
        self,
        plan: RoutePlan,
        state: ArmState | None,
        epoch: int,
        now: float,
        spread: float = DEFAULT_SAMPLE_SPREAD,
    ) -> ArmView:
        """``plan``'s arm (merged ``state``) as the choice sees it under ``epoch`` at ``now``,
        its requests straying by ``spread`` (``sample_spread``)."""
        if state is None or state.samples == 0:
            # Unsampled: its age counts from when this tracker first listed it, so the
            # bound on unmeasured time covers routes never measured too (ADR-0018).
            with self._lock:
                listed = self._listed.setdefault((plan.model_key, plan.signature), now)
            age = max(now - listed, 0.0)
            return ArmView(plan, ArmStatus.UNSAMPLED, None, 0.0, 0, age, spread)
        weight = state.mass_at(now, self.half_life)
        if state.epoch < epoch:
            status = ArmStatus.STALE
        elif weight < PROVEN_MASS:
            status = ArmStatus.DECAYED
        else:
            status = ArmStatus.PROVEN
        age = max(now - state.at, 0.0)
        return ArmView(plan, status, state.value, weight, state.samples, age, spread)

    # --- what the sync reads and writes -------------------------------------

    def restore(self, restored: Iterable[tuple[ArmKey, ArmState]]) -> int:
        """Take back arms this tracker wrote before it restarted; those it already holds
        are kept as they are. Returns how many were taken."""
        with self._lock:
            fresh = [(key, state) for key, state in restored if key not in self._own]
            self._own.update(fresh)
        return len(fresh)

    def take_unwritten(self) -> list[tuple[ArmKey, ArmState]]:
        """Own arms that took samples since the last call (for the archive to write)."""
        with self._lock:
            changed = [(key, self._own[key]) for key in self._unwritten if key in self._own]
            self._unwritten.clear()
        return changed

    def mark_unwritten(self, keys: Iterable[ArmKey]) -> None:
        """These arms' write failed: write them next time, unless pruned meanwhile."""
        with self._lock:
            self._unwritten.update(key for key in keys if key in self._own)

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
                    arm = self._own.get(record.key)
                    if arm is not None and arm.at <= record.last_sample_at + SAME_TIME:
                        del self._own[record.key]
                        self._unwritten.discard(record.key)
                        dropped += 1
                peer = self._peers.get(record.key)
                if peer is not None and peer.at <= record.last_sample_at + SAME_TIME:
                    del self._peers[record.key]
                known = self._tombstones.get(record.key)
                if known is None or known[0] < record.last_sample_at:
                    self._tombstones[record.key] = (record.last_sample_at, now)
        return dropped

    def drop_old_tombstones(self) -> None:
        now = self.clock()
        with self._lock:
            for key in [
                k for k, (_, at) in self._tombstones.items() if at + TOMBSTONE_SECONDS < now
            ]:
                del self._tombstones[key]

    def export(self) -> list[list[Any]]:
        """This tracker's own arms as rows (never what it merged in), for its peers."""
        with self._lock:
            return [arm.to_row(key) for key, arm in self._own.items()]

    def absorb(self, rows_per_peer: Iterable[Iterable[Sequence[Any]]]) -> None:
        """Replace the peers' arms with these (each peer's ``export``), merged by decayed
        weight; states the prune job deleted (see ``forget_pruned``) are left out."""
        with self._lock:
            tombstones = dict(self._tombstones)
        peers: dict[ArmKey, ArmState] = {}
        for rows in rows_per_peer:
            for row in rows:
                key, state = ArmState.from_row(row)
                tomb = tombstones.get(key)
                if tomb is not None and state.at <= tomb[0] + SAME_TIME:
                    continue
                known = peers.get(key)
                peers[key] = state if known is None else known.merged(state, self.half_life)
        with self._lock:
            self._peers = peers
