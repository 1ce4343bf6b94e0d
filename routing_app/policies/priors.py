"""Route priors from what is known of the nodes on a route (ADR-0018).

N heads × M tails are N×M routes; measuring each one before trusting it is
N×M cold starts. A route's speed is mostly its nodes' speeds: each token
spends some time in every hop. So the time per token of a route is modelled
as the sum over its hops of (layers the hop runs × its node's seconds per
layer), the node's seconds per layer starting from its record (1 / (score ×
shard layers), ``RoutePlan.layer_seconds``) and corrected by the measured
routes through it:

1. a global calibration: the (mass-weighted, geometric) mean ratio of measured
   to record-implied time over the measured routes (what the records miss:
   network, prefill, the proxy);
2. per node a factor, fitted a few rounds by spreading each measured route's
   remaining ratio over its nodes in proportion to their share of its time
   (iterative proportional fitting, shrunk toward 1 by ``NODE_PRIOR_MASS``).

An unmeasured route's prior is then the predicted tok/s, with a spread that
is ``KNOWN_SIGMA`` when every node on it is on some measured route and grows
to the broad ``PRIOR_SIGMA`` with the share of its time on nodes that are not.
A stale route (measured under an older topology, same nodes) keeps its own
old speed with ``KNOWN_SIGMA``. A route's own end-to-end samples stay the
truth: once it is measured the prior is not read for it, and nothing here is
stored or billed.

A node's record is its own claim (registration benchmark, heartbeat tokens/s),
so it never outranks what the tracker measured (ADR-0008): once any route of
the model has a measurement (proven, decayed or stale), no hop is taken to run
a layer faster than the fastest measured route runs one on average
(``NodeModel.floor``). A claim may make a node look slower, never faster than
the best the tracker has seen; the fit uses the floored times too, so a node
claiming to take no time cannot push a measured route's slowness onto its
honest co-hops. With no measurement at all the claims are all there is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from routing_app.learning.arms import ArmStatus, ArmView

# Spread (ln tok/s) of a prediction from measured nodes: a route of known nodes may
# still differ by its links and how its hops overlap (0.5: about ±65 %).
KNOWN_SIGMA = 0.5
# Spread of a prediction from node records alone (as thompson.PRIOR_SIGMA).
UNKNOWN_SIGMA = 1.0
# How many samples' worth a node's record weighs against the measured routes through it.
NODE_PRIOR_MASS = 1.0
# Rounds of proportional fitting: enough for routes sharing a node or two.
FIT_ROUNDS = 3
# Samples' worth at most one measured route counts for (as thompson's cap).
MASS_CAP = 9.0

MEASURED = frozenset({ArmStatus.PROVEN, ArmStatus.DECAYED})
# Arms whose speed the tracker itself measured, under this topology or an older one.
TIMED = frozenset({ArmStatus.PROVEN, ArmStatus.DECAYED, ArmStatus.STALE})
# Rounds that settle the calibration and the floor together (each depends on the other).
FLOOR_ROUNDS = 2


def _hop_terms(arm: ArmView, floor: float = 0.0) -> list[tuple[str, float]] | None:
    """(node id, record-implied seconds per token) per hop, each at least ``floor``
    seconds per layer; None without usable records."""
    plan = arm.plan
    if len(plan.layer_seconds) != len(plan.hops):
        return None
    terms = []
    for hop, seconds in zip(plan.hops, plan.layer_seconds, strict=True):
        if not math.isfinite(seconds) or seconds <= 0:
            return None
        terms.append((hop.node_id, max(seconds, floor) * (hop.end_layer - hop.start_layer + 1)))
    return terms


def measured_layer_seconds(arms: Sequence[ArmView]) -> float:
    """The fastest measured route's seconds per layer (its time per token over the layers
    it runs): the best the tracker has seen a layer run; 0 when nothing is measured."""
    fastest = 0.0
    for arm in arms:
        if arm.status not in TIMED or not arm.tps or arm.tps <= 0:
            continue
        layers = sum(hop.end_layer - hop.start_layer + 1 for hop in arm.plan.hops)
        seconds = 1.0 / (arm.tps * layers)
        fastest = seconds if fastest == 0.0 else min(fastest, seconds)
    return fastest


class NodeModel:
    """Per-node time factors fitted to the measured routes among ``arms``.

    ``floor``: the least record-implied seconds per layer a hop is taken at —
    the fastest measured route's (``measured_layer_seconds``) before
    calibration — so that no claim predicts a node faster than what the
    tracker measured; 0 while nothing is measured.
    """

    def __init__(self, arms: Sequence[ArmView]) -> None:
        self.factors: dict[str, float] = {}
        self.calibration = 1.0
        fastest = measured_layer_seconds(arms)
        self.floor = fastest  # until a calibration exists (only stale routes: none)
        timed = [
            (arm, 1.0 / arm.tps, min(max(arm.weight, 0.1), MASS_CAP))
            for arm in arms
            if arm.status in MEASURED and arm.tps and arm.tps > 0
        ]
        measured: list[tuple[list[tuple[str, float]], float, float]] = []
        for _ in range(FLOOR_ROUNDS if fastest > 0 else 1):
            measured = self._floored(timed, fastest / self.calibration)
            if not measured:
                return
            total = sum(weight for *_, weight in measured)
            self.calibration = math.exp(
                sum(
                    weight * math.log(seconds / sum(t for _, t in terms))
                    for terms, seconds, weight in measured
                )
                / total
            )
        self.floor = fastest / self.calibration
        measured = self._floored(timed, self.floor)
        logs = {node: 0.0 for terms, _, _ in measured for node, _ in terms}
        for _ in range(FIT_ROUNDS):
            pull = dict.fromkeys(logs, 0.0)
            mass = dict.fromkeys(logs, NODE_PRIOR_MASS)
            for terms, seconds, weight in measured:
                parts = [t * math.exp(logs[node]) for node, t in terms]
                ratio = math.log(seconds / (self.calibration * sum(parts)))
                for (node, _), part in zip(terms, parts, strict=True):
                    share = part / sum(parts)
                    pull[node] += weight * share * ratio
                    mass[node] += weight * share
            for node in logs:
                logs[node] += pull[node] / mass[node]
        self.factors = {node: math.exp(value) for node, value in logs.items()}

    @staticmethod
    def _floored(
        timed: Sequence[tuple[ArmView, float, float]], floor: float
    ) -> list[tuple[list[tuple[str, float]], float, float]]:
        """(hop terms at least ``floor`` per layer, seconds, weight) per measured arm."""
        floored = []
        for arm, seconds, weight in timed:
            terms = _hop_terms(arm, floor)
            if terms is not None:
                floored.append((terms, seconds, weight))
        return floored

    def predict(self, arm: ArmView) -> tuple[float, float] | None:
        """The arm's predicted ln tok/s and spread; None when its records say nothing."""
        terms = _hop_terms(arm, self.floor)
        if terms is None:
            return None
        known = unknown = 0.0
        for node, seconds in terms:
            factor = self.factors.get(node)
            if factor is None:
                unknown += seconds
            else:
                known += seconds * factor
        time = self.calibration * (known + unknown)
        share_unknown = unknown / (known + unknown) if self.factors else 1.0
        variance = KNOWN_SIGMA**2 + share_unknown * (UNKNOWN_SIGMA**2 - KNOWN_SIGMA**2)
        return -math.log(time), math.sqrt(variance)


def route_priors(
    arms: Sequence[ArmView], model: NodeModel | None = None
) -> list[tuple[float, float] | None]:
    """Per arm: the belief (ln tok/s mean, spread) it enters the draw with when it has no
    measurement under the current topology; None for measured and kept-out arms.

    Stale arms keep their own old speed (``KNOWN_SIGMA``); unsampled arms are
    predicted from their nodes (``model``, else a ``NodeModel`` fitted to ``arms``), or
    from the best prior's scale when their records say nothing (the broad
    ``UNKNOWN_SIGMA``).
    """
    priors: list[tuple[float, float] | None] = []
    for arm in arms:
        if arm.status is ArmStatus.STALE and arm.tps and arm.tps > 0:
            priors.append((math.log(arm.tps), KNOWN_SIGMA))
        elif arm.status in (ArmStatus.UNSAMPLED, ArmStatus.STALE):
            model = model or NodeModel(arms)
            predicted = model.predict(arm)
            if predicted is None:
                scale = arm.plan.prior_tps * model.calibration
                if model.floor > 0:  # a claim, however large, at most the best measured
                    layers = arm.plan.last_layer + 1
                    scale = min(scale, 1.0 / (model.calibration * model.floor * layers))
                predicted = (math.log(scale) if scale > 0 else 0.0, UNKNOWN_SIGMA)
            priors.append(predicted)
        else:
            priors.append(None)
    return priors


def cold_pick(arms: Sequence[ArmView]) -> int:
    """Index of the arm a cold start (no proven arm) takes: the planner's first (best
    claim) while nothing is timed; else the best prior mean (``route_priors``: a
    stale arm's own old speed, an unsampled one floored at the best measured), a
    measured arm winning a tie, so that a claim never outranks a measurement."""
    if not any(arm.status in TIMED and arm.tps and arm.tps > 0 for arm in arms):
        return 0
    priors = route_priors(arms)

    def rank(i: int) -> tuple[float, bool, int]:
        prior, arm = priors[i], arms[i]
        if prior is not None:
            mean = prior[0]
        else:
            mean = math.log(arm.tps) if arm.tps and arm.tps > 0 else -math.inf
        # Rounded: a claim floored at the best measured speed ties it, up to float error.
        timed = arm.status in TIMED and bool(arm.tps and arm.tps > 0)
        return (round(mean, 9), timed, -i)

    return max(range(len(arms)), key=rank)
