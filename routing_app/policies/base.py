"""The route policy's interface, and the guarantees every policy keeps (ADR-0021, ADR-0011).

A ``RoutePolicy`` answers three questions about a model's candidates (their
``ArmView``, best prior first): which one takes the next request
(``choose``), what share of traffic each can expect (``shares``, the
``expected_share`` of ``/v1/routing``) and whether a one-off scout to one of
them is due (``scout_due``). All three read the same views, so they never
disagree.

What every policy guarantees is done here, once: an arm kept out
(status ``quarantined``) is never chosen, and with no proven arm the
best-prior one is taken deterministically (``greedy-fallback``), unless the
policy spreads a burst of requests at a cold start (``thompson-load`` does
once requests are in flight, ADR-0018). A policy
implements the rest on the eligible arms, some of them proven. The two
implementations are ``routing_app.policies.adr0021.Adr0021Policy`` and
``routing_app.policies.thompson.ThompsonLoadPolicy``; ``RoutePolicyConfig.route_policy()``
builds the one the configuration names.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from routing_app.learning.arms import ArmStatus, ArmView
from routing_app.policies.choice import DecisionMode
from routing_app.policies.load import NO_LOAD, LoadSnapshot
from routing_app.policies.priors import cold_pick

# No route holds any of the request's prefix (or it has none).
NO_WARMTH: Mapping[str, float] = {}


class Pick(NamedTuple):
    """The arm a policy chose for a request, and how."""

    arm: ArmView
    mode: DecisionMode


def _eligible(arms: Sequence[ArmView]) -> list[int]:
    """Indices of the arms that may be chosen (not kept out), in the order given."""
    return [i for i, arm in enumerate(arms) if arm.status is not ArmStatus.QUARANTINED]


def _any_proven(arms: Sequence[ArmView]) -> bool:
    return any(arm.status is ArmStatus.PROVEN for arm in arms)


class RoutePolicy(ABC):
    """How requests are spread over a model's candidate routes."""

    def choose(
        self,
        arms: Sequence[ArmView],
        *,
        rng: random.Random,
        loads: LoadSnapshot = NO_LOAD,
        warm: Mapping[str, float] = NO_WARMTH,
    ) -> Pick | None:
        """The pick among ``arms`` (best prior first) and how it was made; ``None`` when
        every arm is kept out. With no proven arm: the first eligible one.

        ``loads`` are the sessions in flight (``thompson-load`` weighs them);
        ``warm``, by route signature, how much faster (ln) this request would run
        on a route for the prefix its nodes hold
        (``routing_app.learning.prefix_memory``): an exploiting pick weighs it with
        the route's speed. A scout measures a route whatever it holds.
        """
        eligible = [arms[i] for i in _eligible(arms)]
        if not eligible:
            return None
        if not _any_proven(eligible):
            return self._cold_start(eligible, rng, loads)
        return self._choose(eligible, rng, loads, warm)

    def shares(
        self, arms: Sequence[ArmView], *, loads: LoadSnapshot = NO_LOAD, include_scout: bool = True
    ) -> list[float]:
        """Each arm's expected share of traffic, in the order given.

        ``include_scout=False`` leaves out a one-off scout of a due route
        (``scout_due`` names it) and gives the shares the policy's traffic
        follows, rather than where the next single request goes.
        """
        shares = [0.0] * len(arms)
        eligible = _eligible(arms)
        if not eligible:
            return shares
        views = [arms[i] for i in eligible]
        cold = not _any_proven(views)
        own = self._cold_shares(views, loads) if cold else self._shares(views, loads, include_scout)
        for i, share in zip(eligible, own, strict=True):
            shares[i] = share
        return shares

    def scout_due(self, arms: Sequence[ArmView], *, loads: LoadSnapshot = NO_LOAD) -> list[bool]:
        """Per arm: whether the next request goes to it for sure, as a one-off scout."""
        due = [False] * len(arms)
        eligible = _eligible(arms)
        views = [arms[i] for i in eligible]
        if not _any_proven(views):
            return due
        target = self._scout_target(views, loads)
        if target is not None:
            due[eligible[target]] = True
        return due

    def _cold_start(
        self, eligible: Sequence[ArmView], rng: random.Random, loads: LoadSnapshot
    ) -> Pick:
        """The pick with no proven arm: the best prior, where a node's claimed speed never
        outranks a measured one (``priors.cold_pick``; a policy may spread a burst)."""
        return Pick(eligible[cold_pick(eligible)], DecisionMode.GREEDY_FALLBACK)

    def _cold_shares(self, eligible: Sequence[ArmView], loads: LoadSnapshot) -> list[float]:
        """Expected shares with no proven arm, as ``_cold_start`` picks."""
        best = cold_pick(eligible)
        return [1.0 if i == best else 0.0 for i in range(len(eligible))]

    @abstractmethod
    def _choose(
        self,
        eligible: Sequence[ArmView],
        rng: random.Random,
        loads: LoadSnapshot,
        warm: Mapping[str, float],
    ) -> Pick:
        """The pick among ``eligible`` (none kept out, some proven), ``warm`` as
        ``choose`` takes it."""

    @abstractmethod
    def _shares(
        self, eligible: Sequence[ArmView], loads: LoadSnapshot, include_scout: bool
    ) -> list[float]:
        """Each of ``eligible``'s (none kept out, some proven) expected share."""

    def _scout_target(self, eligible: Sequence[ArmView], loads: LoadSnapshot) -> int | None:
        """The index among ``eligible`` of a one-off scout due now; a policy that scouts a
        steady share of traffic instead has none."""
        return None
