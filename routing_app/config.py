"""The routing policy's knobs (ADR-0021), read from Django settings at call time.

``meshnet_site.settings`` reads the ``MESHNET_ROUTE_*`` environment variables
and ``runtracker`` overrides the same settings attributes from its flags, so
the one way to get the active policy is ``RoutingConfig.from_settings()``,
called when the value is needed (never at import time).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from django.conf import settings

from meshnet_site.environment import check_range

# At most this many candidate routes per model take part in the choice.
MAX_CANDIDATES = 8


@dataclass(frozen=True)
class RoutingConfig:
    """The active routing policy. Constructing one with an out-of-range value raises
    ``ImproperlyConfigured`` naming the setting, so a bad flag stops start-up."""

    explore_share: float = 0.3
    weight_alpha: float = 1.0
    stats_half_life: float = 600.0
    min_sample_tokens: int = 8

    def __post_init__(self) -> None:
        check_range("MESHNET_ROUTE_EXPLORE_SHARE", self.explore_share, minimum=0.0, maximum=1.0)
        check_range(
            "MESHNET_ROUTE_WEIGHT_ALPHA", self.weight_alpha, minimum=0.0, exclusive_minimum=True
        )
        check_range(
            "MESHNET_ROUTE_STATS_HALF_LIFE",
            self.stats_half_life,
            minimum=0.0,
            exclusive_minimum=True,
        )
        check_range("MESHNET_ROUTE_MIN_SAMPLE_TOKENS", self.min_sample_tokens, minimum=1)

    @classmethod
    def from_settings(cls) -> RoutingConfig:
        """The policy as the settings say now (after any ``runtracker`` flag overrides)."""
        return cls(
            explore_share=float(settings.MESHNET_ROUTE_EXPLORE_SHARE),
            weight_alpha=float(settings.MESHNET_ROUTE_WEIGHT_ALPHA),
            stats_half_life=float(settings.MESHNET_ROUTE_STATS_HALF_LIFE),
            min_sample_tokens=int(settings.MESHNET_ROUTE_MIN_SAMPLE_TOKENS),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
