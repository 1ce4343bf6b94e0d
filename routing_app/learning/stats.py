"""The route statistics the choice reads: learned arms and exclusions, composed.

``RouteStatsStore`` puts together what a candidate looks like to the
policy and to ``/v1/routing``: its arm (``routing_app.learning.arms``: learned speed,
status under the current topology epoch) unless it is kept out
(``routing_app.exclusions.kept_out``: quarantined, or through a banned node), which
overrides the status. It never touches a database or a network: keeping it
in step with the durable copy and the peers is ``routing_app.learning.sync``'s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from routing_app.exclusions.kept_out import Exclusions
from routing_app.learning.arms import ArmStatus, ArmView, Clock, RouteArms
from routing_app.planning.route_plan import RoutePlan
from routing_app.policies.config import RoutePolicyConfig


class RouteStatsStore:
    """One tracker process's route statistics: ``arms`` and ``exclusions``."""

    def __init__(
        self, *, half_life: float = 600.0, min_sample_tokens: int = 8, clock: Clock = time.time
    ) -> None:
        self.clock = clock
        self.arms = RouteArms(half_life=half_life, min_sample_tokens=min_sample_tokens, clock=clock)
        self.exclusions = Exclusions(clock=clock)

    @classmethod
    def from_config(cls, config: RoutePolicyConfig, *, clock: Clock = time.time) -> RouteStatsStore:
        return cls(
            half_life=config.stats_half_life,
            min_sample_tokens=config.min_sample_tokens,
            clock=clock,
        )

    def views(self, *, plans: Sequence[RoutePlan], epoch: int) -> list[ArmView]:
        """Each plan's arm under the current ``epoch``, in the order given."""
        now = self.clock()
        kept_out = self.exclusions.kept_out(plans)
        states = self.arms.states((plan.model_key, plan.signature) for plan in plans)
        spreads: dict[str, float] = {}
        views = []
        for plan, state, out in zip(plans, states, kept_out, strict=True):
            if plan.model_key not in spreads:
                spreads[plan.model_key] = self.arms.sample_spread(plan.model_key)
            view = self.arms.view(plan, state, epoch, now, spreads[plan.model_key])
            views.append(replace(view, status=ArmStatus.QUARANTINED) if out else view)
        return views
