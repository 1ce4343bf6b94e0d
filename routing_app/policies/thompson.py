"""The load-aware discounted Thompson sampling route choice (ADR-0011, ``thompson-load``).

Each measured arm's belief about its log tokens/s is a normal posterior
centred on the stats' EWMA, narrowing with the arm's *decayed* sample mass
(each sample as informative as the model's requests are steady: the sample
spread the tracker learned, ``routing_app.learning.arms.SampleSpread``) and widening
back to a broad prior as that mass decays (so a quiet arm is
retried: discounted Thompson sampling). The requests in flight on the route
count as the samples they would give if they ended now (once they have
streamed a little), so a route that slowed down loses traffic before its
slow requests complete. A request draws once from every belief, subtracts
the route's load penalty ``load_exponent × ln(1 + sessions in flight on it)``
(a saturated fast route sheds traffic, as peak-EWMA load balancers do) and
takes the highest score. Uncertainty, not a fixed share, decides how much
to explore.

The ADR-0021 guarantees stay: kept-out arms are never chosen, and with no
proven arm and nothing in flight the best-prior candidate is taken
deterministically (``routing_app.policies.base.RoutePolicy``). ADR-0018 amends the
rest: arms not measured under the current topology epoch (unsampled, stale)
are no longer scouted one request at a time before any draw; they enter the
draw with a prior from what is known of their nodes (``routing_app.policies.priors``),
wider than a measured arm's belief, so N heads × M tails are not N×M cold
starts. With no proven arm but requests in flight (a burst at a cold start)
the draw runs on those priors too, so the burst spreads over the candidates
rather than all taking the best prior. An arm that has had neither a sample
nor a request sent to it (an unsampled one: since this tracker first listed
it) for ``DUE_SHARE`` of ``max_unsampled_seconds`` takes the next request
once nothing is in flight on it (so it goes unmeasured for the bound at most,
plus the wait for that request).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from routing_app.learning.arms import EFFECTIVE_SAMPLES_CAP, ArmStatus, ArmView, sample_added
from routing_app.planning.route_plan import RoutePlan
from routing_app.policies.base import NO_WARMTH, Pick, RoutePolicy
from routing_app.policies.choice import DecisionMode
from routing_app.policies.load import LoadSnapshot, Pace
from routing_app.policies.priors import NodeModel, route_priors

# Spread of the belief before any evidence: a route may be several times
# faster or slower than the last we knew (1.0: a factor e either way). An arm
# whose evidence has decayed away returns to it, so a route that recovered is
# retried long before the bound on unsampled time forces a scout.
PRIOR_SIGMA = 1.0
# A measured arm falls due for a scout at this share of the bound on unsampled
# time, not at the bound itself: arms measured together (every arm is scouted
# at once after a topology change) fall due together, one request scouts one
# of them, and the last would wait past the bound for its turn.
DUE_SHARE = 0.95
# Points of the rule that integrates P(arm draws highest) for expected shares.
_GRID = [-6.0 + 12.0 * i / 160 for i in range(161)]
_GRID_WEIGHTS = [math.exp(-z * z / 2) for z in _GRID]

MEASURED = frozenset({ArmStatus.PROVEN, ArmStatus.DECAYED})


def belief(
    arm: ArmView,
    paces: Sequence[Pace],
    min_tokens: int,
    prior: tuple[float, float] | None = None,
) -> tuple[float, float]:
    """Mean and spread of the arm's ln tok/s (a measured arm: tps is known), counting
    the requests in flight on it at their ``paces`` (``anticipated``).

    The normal posterior of a mean seen through ``n`` samples of the arm's
    ``sample_spread`` (learned per model, ``routing_app.learning.arms.SampleSpread``), ``n``
    the arm's decayed mass (at most ``EFFECTIVE_SAMPLES_CAP``), under ``prior``
    (mean, spread): what its nodes predict (``routing_app.policies.priors``). Without one the
    prior is broad (``PRIOR_SIGMA``) and centred on the arm's own speed. As the arm's mass
    decays its belief returns to the prior: to what its nodes' fresher samples
    on other routes say, rather than to "anything, a factor e either way".
    """
    tps, mass = anticipated(arm, paces, min_tokens)
    effective = min(mass, EFFECTIVE_SAMPLES_CAP)
    own = effective / arm.sample_spread**2
    if prior is None:
        prior = (math.log(tps), PRIOR_SIGMA)
    prior_mean, prior_sigma = prior
    precision = 1.0 / prior_sigma**2 + own
    mean = (prior_mean / prior_sigma**2 + own * math.log(tps)) / precision
    return mean, 1.0 / math.sqrt(precision)


def anticipated(arm: ArmView, paces: Sequence[Pace], min_tokens: int) -> tuple[float, float]:
    """The arm's tokens/s and mass with each request in flight on it counted as the
    sample it will give if it streams on at its pace (``Pace.projected``): their
    samples, taken early.

    A route's samples arrive only as requests complete, long after a node slowed
    down when requests are long (a 5x slower route takes seconds per request, and
    every request sent meanwhile goes to it). A pace (``load.Pace``) counts once
    the request has streamed, since its first token, as long as the arm's
    believed speed needs for twice a sample's worth of tokens (``min_tokens``),
    however many came: a stream stalled mid-way is evidence; a prefill, a
    request's first few tokens, or a backlog of frames read at once are not.
    """
    assert arm.tps is not None and arm.tps > 0
    tps, mass = arm.tps, arm.weight
    for pace in paces:
        if pace.streaming * arm.tps >= 2 * min_tokens:
            tps, mass = sample_added(tps, mass, pace.projected())
    return tps, mass


def unmeasured_for(arm: ArmView, loads: LoadSnapshot) -> float:
    """Seconds the arm has gone without a sample *or* a request sent to measure it.

    Sending restarts the clock: a scout that fails or brings back too few
    tokens to count leaves the sample old, and without this the route would
    take every request until one counted.
    """
    if arm.last_sample_age is None:
        return 0.0
    sent = loads.seconds_since_sent(arm.plan)
    return arm.last_sample_age if sent is None else min(arm.last_sample_age, sent)


def hop_shares(plan: RoutePlan) -> list[float]:
    """Each hop's share of a token's time on ``plan``, from its nodes' records (layers ×
    seconds per layer); equal shares when a record says nothing."""
    times = plan.hop_seconds
    if len(times) != len(plan.hops) or not all(math.isfinite(t) and t > 0 for t in times):
        return [1.0 / len(plan.hops)] * len(plan.hops)
    total = sum(times)
    return [t / total for t in times]


def sessions_at_nodes(eligible: Sequence[ArmView], loads: LoadSnapshot) -> dict[str, float]:
    """Sessions at each node at once, on average: each route's sessions in flight times
    each hop's share of its time (a session's one token is at one node at a time)."""
    at_nodes: dict[str, float] = {}
    for arm in eligible:
        sessions = loads.route_sessions(arm.plan)
        if sessions:
            for node_id, share in zip(arm.plan.node_ids, hop_shares(arm.plan), strict=True):
                at_nodes[node_id] = at_nodes.get(node_id, 0.0) + sessions * share
    return at_nodes


def _probability_highest(index: int, scores: Sequence[tuple[float, float]]) -> float:
    """P(draw ``index`` beats every other), each draw normal (mean, spread)."""
    mean, spread = scores[index]
    total = 0.0
    for z, weight in zip(_GRID, _GRID_WEIGHTS, strict=True):
        x = mean + spread * z
        product = weight
        for other, (other_mean, other_spread) in enumerate(scores):
            if other != index:
                product *= 0.5 * math.erfc(-(x - other_mean) / (other_spread * math.sqrt(2.0)))
        total += product
    return total / sum(_GRID_WEIGHTS)


class ThompsonLoadPolicy(RoutePolicy):
    """ADR-0011's policy: scouts when due, else the best draw of (belief − load penalty)."""

    def __init__(
        self, *, max_unsampled_seconds: float, load_exponent: float, min_sample_tokens: int
    ) -> None:
        self.max_unsampled_seconds = max_unsampled_seconds
        self.load_exponent = load_exponent
        self.min_sample_tokens = min_sample_tokens

    def load_penalty(self, arm: ArmView, at_nodes: Mapping[str, float]) -> float:
        """How much the sessions in flight at the route's nodes lower its score (ln tok/s).

        A node batching k sessions runs each about k^0.6 times slower than one
        alone (ADR-0010's 2.3x aggregate at 8). A session has one token in flight,
        so it is at one node of its route at a time: ``at_nodes`` counts each
        session at each of its nodes by its share of the route's time there
        (``sessions_at_nodes``). A new session's token time on the route is then
        its hops' times, each slowed by (1 + sessions at that node)^e, with e the
        ``load_exponent`` (0.5, a little below 0.6 because the measured speed
        already holds the usual load). On a one-hop route with k sessions this is
        e·ln(1 + k); on a pipeline the stages work at once, and sessions on other
        routes through the same node count too.
        """
        shares = hop_shares(arm.plan)
        slowed = sum(
            share * max(1.0, at_nodes.get(node_id, 0.0) + share) ** self.load_exponent
            for node_id, share in zip(arm.plan.node_ids, shares, strict=True)
        )
        return math.log(slowed)

    def _scout_target(self, eligible: Sequence[ArmView], loads: LoadSnapshot) -> int | None:
        """Index of the arm that must be measured now, if any: arms falling due under the
        ``max_unsampled_seconds`` bound (``unmeasured_for`` past ``DUE_SHARE`` of it),
        longest first, whatever their status. An arm with a request in flight is being
        measured already and is skipped. Unmeasured arms are not scouted before the
        draw any more (ADR-0018): they take part in it with their priors.
        """
        due_after = self.max_unsampled_seconds * DUE_SHARE
        quiet = {
            i: unmeasured_for(arm, loads)
            for i, arm in enumerate(eligible)
            if loads.route_sessions(arm.plan) == 0
        }
        overdue = [i for i, seconds in quiet.items() if seconds > due_after]
        if overdue:
            return max(overdue, key=lambda i: (quiet[i], -i))
        return None

    def _beliefs(
        self,
        eligible: Sequence[ArmView],
        loads: LoadSnapshot,
        warm: Mapping[str, float] = NO_WARMTH,
    ) -> list[tuple[float, float]]:
        """Each arm's (score mean, spread): its belief, or its prior when it has no
        measurement under this topology, less its load penalty, plus its ``warm``th for
        the request (the ln speed-up of the prefix its nodes hold)."""
        model = NodeModel(eligible)
        priors = route_priors(eligible, model)
        at_nodes = sessions_at_nodes(eligible, loads)
        scores = []
        for arm, prior in zip(eligible, priors, strict=True):
            if prior is None:
                paces = loads.route_paces(arm.plan)
                nodes = model.predict(arm) if model.factors else None
                mean, spread = belief(arm, paces, self.min_sample_tokens, nodes)
            else:
                mean, spread = prior
            bonus = warm.get(arm.plan.signature, 0.0)
            scores.append((mean - self.load_penalty(arm, at_nodes) + bonus, spread))
        return scores

    def _draw(
        self,
        eligible: Sequence[ArmView],
        rng: random.Random,
        loads: LoadSnapshot,
        warm: Mapping[str, float] = NO_WARMTH,
    ) -> Pick:
        """The arm with the highest draw; a pick of an unmeasured arm measures it (scout)."""
        best, best_score = 0, -math.inf
        for i, (mean, spread) in enumerate(self._beliefs(eligible, loads, warm)):
            score = rng.normalvariate(mean, spread)
            if score > best_score:
                best, best_score = i, score
        arm = eligible[best]
        return Pick(arm, DecisionMode.EXPLOIT if arm.status in MEASURED else DecisionMode.SCOUT)

    def _choose(
        self,
        eligible: Sequence[ArmView],
        rng: random.Random,
        loads: LoadSnapshot,
        warm: Mapping[str, float],
    ) -> Pick:
        """A due scout, else the highest draw of (belief or prior) less the load penalty
        plus the request's warmth."""
        target = self._scout_target(eligible, loads)
        if target is not None:
            return Pick(eligible[target], DecisionMode.SCOUT)
        return self._draw(eligible, rng, loads, warm)

    def _cold_start(
        self, eligible: Sequence[ArmView], rng: random.Random, loads: LoadSnapshot
    ) -> Pick:
        """No proven arm: the best prior while nothing is in flight, else the draw on priors."""
        if not any(loads.route_sessions(arm.plan) for arm in eligible):
            return super()._cold_start(eligible, rng, loads)
        return self._draw(eligible, rng, loads)

    def _cold_shares(self, eligible: Sequence[ArmView], loads: LoadSnapshot) -> list[float]:
        if not any(loads.route_sessions(arm.plan) for arm in eligible):
            return super()._cold_shares(eligible, loads)
        return self._draw_shares(eligible, loads)

    def _draw_shares(self, eligible: Sequence[ArmView], loads: LoadSnapshot) -> list[float]:
        scores = self._beliefs(eligible, loads)
        shares = [_probability_highest(i, scores) for i in range(len(scores))]
        total = sum(shares)
        return [share / total for share in shares] if total > 0 else shares

    def _shares(
        self, eligible: Sequence[ArmView], loads: LoadSnapshot, include_scout: bool
    ) -> list[float]:
        """Each arm's chance of taking the next request under ``_choose``.

        A due scout takes the next request for sure (share 1); with
        ``include_scout=False`` the draw's shares are given instead (what the
        policy does once its scouting is done).
        """
        if include_scout:
            target = self._scout_target(eligible, loads)
            if target is not None:
                shares = [0.0] * len(eligible)
                shares[target] = 1.0
                return shares
        return self._draw_shares(eligible, loads)
