"""What a route choice hands out: the decision, how it was made, and its refusal.

``services.route_choose`` makes the choice for one request with the
configured policy (``routing_app.policies.base``) and returns a ``RouteDecision``;
the proxy sends the request on ``decision.plan`` and records against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from meshnet_site.errors import DomainError, ErrorKind
from routing_app.planning.route_plan import RoutePlan


class DecisionMode(StrEnum):
    SCOUT = "scout"
    EXPLOIT = "exploit"
    PINNED = "pinned"
    GREEDY_FALLBACK = "greedy-fallback"


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The plan to run, how it was chosen, and the topology epoch it was chosen under.

    Record the request's speed against ``epoch`` so a sample measured across
    a topology change never lands on the newer epoch's statistics.
    """

    plan: RoutePlan
    mode: DecisionMode
    epoch: int

    def to_dict(self) -> dict[str, Any]:
        """The chat response's ``meshnet`` field."""
        return {"route": self.plan.signature, "mode": str(self.mode), "hops": self.plan.to_dict()}


class NoRouteAvailable(DomainError):
    """No route can serve the model now; ``reason`` says why (for the client to read)."""

    kind = ErrorKind.UNAVAILABLE
    code = "no_route"

    def __init__(self, model_key: str, reason: str) -> None:
        super().__init__(f"No route can serve {model_key} right now: {reason}")
