"""Pricing and the split of a charge among the hops that did the work.

Pure functions over Decimal: no database, no floats. A request's charge is
priced per 1k prompt and completion tokens, the prompt tokens a route did not
recompute (``cached``, a prefix-cache hit, ADR-0027) at the model's cached
price; the network keeps a fee and the rest is split among work units (tokens
computed × layers run) so that the node
shares add up to the charge minus the fee exactly, to the last unit of the
money precision. :func:`request_work` says which hops did how much work for
a request that may have failed over between routes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal
from typing import Protocol

MONEY = Decimal("0.000001")  # six decimal places: fractions of a cent per request
THOUSAND = Decimal(1000)


@dataclass(frozen=True)
class HopWork:
    """What one hop of a route did for one request."""

    node_id: str
    start_layer: int
    end_layer: int
    tokens: int
    # The route this hop was part of: a failed-over request has work on
    # several, and the billing audit refunds a request that used a corrupt one.
    route_signature: str = ""

    @property
    def layers(self) -> int:
        return self.end_layer - self.start_layer + 1

    @property
    def units(self) -> int:
        return self.tokens * self.layers


class LayerSpan(Protocol):
    """A hop of a route: the node and the layers it ran."""

    @property
    def node_id(self) -> str: ...

    @property
    def start_layer(self) -> int: ...

    @property
    def end_layer(self) -> int: ...


class ServedRoute(Protocol):
    """The part of one request one route served: its hops, the tokens it was
    given again (replayed after a failover) and the new tokens it produced."""

    @property
    def signature(self) -> str: ...

    @property
    def hops(self) -> Sequence[LayerSpan]: ...

    @property
    def replayed(self) -> int: ...

    @property
    def produced(self) -> int: ...

    @property
    def cached(self) -> int:
        """Prompt tokens the route's hops took from their prefix caches, not recomputed."""
        ...


def request_work(*, prompt_tokens: int, routes: Sequence[ServedRoute]) -> list[HopWork]:
    """One work unit per hop of every route that produced tokens, in order.

    The last route (the one that finished the request) counts even if it
    produced nothing new. A hop's tokens are the prompt but its cached
    positions, the replayed tokens and the new tokens of its route: everything
    it ran its layers over. Each unit carries its route's signature.
    """
    return [
        HopWork(
            node_id=hop.node_id,
            start_layer=hop.start_layer,
            end_layer=hop.end_layer,
            tokens=prompt_tokens
            - min(route.cached, prompt_tokens)
            + route.replayed
            + route.produced,
            route_signature=route.signature,
        )
        for index, route in enumerate(routes)
        if route.produced or index == len(routes) - 1
        for hop in route.hops
    ]


def work_merged(work: Iterable[HopWork]) -> list[HopWork]:
    """The work of several generations of one request (its choices), one unit per hop of
    each route: the tokens of the same node running the same layers on the same route
    are summed, in order of first appearance."""
    merged: dict[tuple[str, int, int, str], HopWork] = {}
    for unit in work:
        key = (unit.node_id, unit.start_layer, unit.end_layer, unit.route_signature)
        seen = merged.get(key)
        merged[key] = unit if seen is None else replace(seen, tokens=seen.tokens + unit.tokens)
    return list(merged.values())


@dataclass(frozen=True)
class Share:
    work: HopWork
    amount: Decimal


@dataclass(frozen=True)
class Invoice:
    prompt_charge: Decimal
    completion_charge: Decimal
    network_fee: Decimal
    shares: list[Share]

    @property
    def charge(self) -> Decimal:
        return self.prompt_charge + self.completion_charge


def price(tokens: int, per_1k: Decimal) -> Decimal:
    return (Decimal(tokens) * per_1k / THOUSAND).quantize(MONEY, rounding=ROUND_HALF_UP)


def prompt_price(
    prompt_tokens: int,
    per_1k: Decimal,
    *,
    cached_tokens: int = 0,
    cached_per_1k: Decimal | None = None,
) -> Decimal:
    """The prompt's charge: (prompt − cached) at ``per_1k`` and cached at ``cached_per_1k``
    (None: at ``per_1k``), rounded once, as :func:`price` rounds."""
    cached = min(max(cached_tokens, 0), prompt_tokens)
    cached_rate = per_1k if cached_per_1k is None else cached_per_1k
    exact = Decimal(prompt_tokens - cached) * per_1k + Decimal(cached) * cached_rate
    return (exact / THOUSAND).quantize(MONEY, rounding=ROUND_HALF_UP)


def invoice(
    *,
    prompt_tokens: int,
    completion_tokens: int,
    prompt_price_per_1k: Decimal,
    completion_price_per_1k: Decimal,
    fee_share: Decimal,
    work: list[HopWork],
    cached_tokens: int = 0,
    cached_price_per_1k: Decimal | None = None,
) -> Invoice:
    """Price a completed request and split it among ``work`` by units.

    ``cached_tokens`` of the prompt are priced at ``cached_price_per_1k`` (None:
    the prompt price, :func:`prompt_price`).

    Rounding: each share is rounded down and the leftover money units go to
    the largest remainders (ties to the earlier hop), so the shares always sum
    to exactly ``charge - network_fee``.
    """
    if not work:
        raise ValueError("a completed request has at least one hop of work")
    prompt_charge = prompt_price(
        prompt_tokens,
        prompt_price_per_1k,
        cached_tokens=cached_tokens,
        cached_per_1k=cached_price_per_1k,
    )
    completion_charge = price(completion_tokens, completion_price_per_1k)
    charge = prompt_charge + completion_charge
    fee = (charge * fee_share).quantize(MONEY, rounding=ROUND_HALF_UP)
    pool = charge - fee
    total_units = sum(w.units for w in work)
    if total_units == 0:
        exact = [pool / len(work)] * len(work)
    else:
        exact = [pool * w.units / total_units for w in work]
    floors = [e.quantize(MONEY, rounding=ROUND_DOWN) for e in exact]
    leftover = int((pool - sum(floors, Decimal(0))) / MONEY)
    by_remainder = sorted(range(len(work)), key=lambda i: (floors[i] - exact[i], i))
    for i in by_remainder[:leftover]:
        floors[i] += MONEY
    shares = [Share(work=w, amount=a) for w, a in zip(work, floors, strict=True)]
    return Invoice(
        prompt_charge=prompt_charge,
        completion_charge=completion_charge,
        network_fee=fee,
        shares=shares,
    )
