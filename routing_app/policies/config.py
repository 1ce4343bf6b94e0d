"""The routing policy and its knobs (ADR-0021, ADR-0011), read from Django settings at call time.

``meshnet_site.settings`` reads the ``MESHNET_ROUTE_*`` environment variables
and ``runtracker`` overrides the same settings attributes from its flags, so
the one way to get the active policy is ``RoutePolicyConfig.from_settings()``,
called when the value is needed (never at import time). ``route_policy()``
builds the policy object the configuration names: the one place a policy's
name is read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from django.conf import settings

from meshnet_site.environment import (
    ROUTE_EXPLORE_SHARE,
    ROUTE_LOAD_EXPONENT,
    ROUTE_MAX_UNSAMPLED,
    ROUTE_MIN_SAMPLE_TOKENS,
    ROUTE_POLICY,
    ROUTE_STATS_HALF_LIFE,
    ROUTE_WEIGHT_ALPHA,
)
from routing_app.policies.adr0021 import Adr0021Policy
from routing_app.policies.base import RoutePolicy
from routing_app.policies.thompson import ThompsonLoadPolicy

# The policy names MESHNET_ROUTE_POLICY accepts (named once, by the setting).
POLICY_THOMPSON_LOAD, POLICY_ADR0021 = ROUTE_POLICY.choices


@dataclass(frozen=True)
class RoutePolicyConfig:
    """The active routing policy. Constructing one with an out-of-range value raises
    ``ImproperlyConfigured`` naming the setting, so a bad flag stops start-up.

    Defaults and ranges are the settings' own (``meshnet_site.environment``).
    """

    policy: str = ROUTE_POLICY.default
    explore_share: float = ROUTE_EXPLORE_SHARE.default
    weight_alpha: float = ROUTE_WEIGHT_ALPHA.default
    stats_half_life: float = ROUTE_STATS_HALF_LIFE.default
    min_sample_tokens: int = int(ROUTE_MIN_SAMPLE_TOKENS.default)
    max_unsampled_seconds: float = ROUTE_MAX_UNSAMPLED.default
    load_exponent: float = ROUTE_LOAD_EXPONENT.default

    def __post_init__(self) -> None:
        ROUTE_POLICY.check(self.policy)
        ROUTE_MAX_UNSAMPLED.check(self.max_unsampled_seconds)
        ROUTE_LOAD_EXPONENT.check(self.load_exponent)
        ROUTE_EXPLORE_SHARE.check(self.explore_share)
        ROUTE_WEIGHT_ALPHA.check(self.weight_alpha)
        ROUTE_STATS_HALF_LIFE.check(self.stats_half_life)
        ROUTE_MIN_SAMPLE_TOKENS.check(self.min_sample_tokens)

    @classmethod
    def from_settings(cls) -> RoutePolicyConfig:
        """The policy as the settings say now (after any ``runtracker`` flag overrides)."""
        return cls(
            policy=str(settings.MESHNET_ROUTE_POLICY),
            explore_share=float(settings.MESHNET_ROUTE_EXPLORE_SHARE),
            weight_alpha=float(settings.MESHNET_ROUTE_WEIGHT_ALPHA),
            stats_half_life=float(settings.MESHNET_ROUTE_STATS_HALF_LIFE),
            min_sample_tokens=int(settings.MESHNET_ROUTE_MIN_SAMPLE_TOKENS),
            max_unsampled_seconds=float(settings.MESHNET_ROUTE_MAX_UNSAMPLED),
            load_exponent=float(settings.MESHNET_ROUTE_LOAD_EXPONENT),
        )

    def route_policy(self) -> RoutePolicy:
        """The policy this configuration names, built with its knobs."""
        if self.policy == POLICY_ADR0021:
            return Adr0021Policy(explore_share=self.explore_share, weight_alpha=self.weight_alpha)
        return ThompsonLoadPolicy(
            max_unsampled_seconds=self.max_unsampled_seconds,
            load_exponent=self.load_exponent,
            min_sample_tokens=self.min_sample_tokens,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
