"""ADR-0021's route policy (``adr0021``): scout at a fixed share, exploit P ∝ tps^alpha.

With probability ``explore_share`` a request scouts the least-measured arm
that is not proven under the current topology (unsampled, stale or
decayed) when there is one; otherwise it is drawn among the proven arms
with probability proportional to tps^``weight_alpha``. The guarantees every
policy keeps (kept-out arms never chosen, the greedy fallback) are
``routing_app.policies.base``'s.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from routing_app.learning.arms import ArmStatus, ArmView, least_measured
from routing_app.policies.base import NO_WARMTH, Pick, RoutePolicy
from routing_app.policies.choice import DecisionMode
from routing_app.policies.load import LoadSnapshot

# What adr0021 scouts: anything not proven under the current topology.
SCOUTABLE = frozenset({ArmStatus.UNSAMPLED, ArmStatus.STALE, ArmStatus.DECAYED})


def _exploit_weights(
    proven: Sequence[ArmView], alpha: float, warm: Mapping[str, float] = NO_WARMTH
) -> list[float]:
    """tps^alpha, each tps sped up by its route's ``warm`` (ln) for this request, scaled
    by the fastest so a large alpha cannot overflow."""
    speeds = [
        max(arm.tps or 0.0, 0.0) * math.exp(warm.get(arm.plan.signature, 0.0)) for arm in proven
    ]
    fastest = max(speeds, default=0.0)
    if fastest <= 0:
        return [0.0] * len(proven)
    return [(speed / fastest) ** alpha for speed in speeds]


class Adr0021Policy(RoutePolicy):
    """ADR-0021 as written; its scouting is a steady share of traffic, never due."""

    def __init__(self, *, explore_share: float, weight_alpha: float) -> None:
        self.explore_share = explore_share
        self.weight_alpha = weight_alpha

    def _choose(
        self,
        eligible: Sequence[ArmView],
        rng: random.Random,
        loads: LoadSnapshot,
        warm: Mapping[str, float],
    ) -> Pick:
        proven = [arm for arm in eligible if arm.status is ArmStatus.PROVEN]
        if rng.random() < self.explore_share:
            pool = [i for i, arm in enumerate(eligible) if arm.status in SCOUTABLE]
            target = least_measured(eligible, pool)
            if target is not None:
                return Pick(eligible[target], DecisionMode.SCOUT)
        weights = _exploit_weights(proven, self.weight_alpha, warm)
        total = sum(weights)
        if total <= 0.0:
            return Pick(proven[0], DecisionMode.EXPLOIT)
        point = rng.random() * total
        for arm, weight in zip(proven, weights, strict=True):
            point -= weight
            if point < 0.0:
                return Pick(arm, DecisionMode.EXPLOIT)
        return Pick(proven[-1], DecisionMode.EXPLOIT)

    def _shares(
        self, eligible: Sequence[ArmView], loads: LoadSnapshot, include_scout: bool
    ) -> list[float]:
        # Scouting is a steady share of traffic here: it stays with or without include_scout.
        shares = [0.0] * len(eligible)
        exploit_share = 1.0
        pool = [i for i, arm in enumerate(eligible) if arm.status in SCOUTABLE]
        target = least_measured(eligible, pool)
        if target is not None and self.explore_share > 0:
            shares[target] = self.explore_share
            exploit_share = 1.0 - self.explore_share
        proven = [i for i, arm in enumerate(eligible) if arm.status is ArmStatus.PROVEN]
        weights = _exploit_weights([eligible[i] for i in proven], self.weight_alpha)
        total = sum(weights)
        for i, weight in zip(proven, weights, strict=True):
            if total > 0:
                shares[i] += exploit_share * weight / total
            elif i == proven[0]:
                shares[i] += exploit_share
        return shares
