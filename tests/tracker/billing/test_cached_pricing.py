"""Prompt tokens a route did not recompute (a prefix-cache hit, ADR-0027): billed at the
model's cached price, and left out of the work the hops are paid for."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from tracker_app.billing.pricing import HopWork, Invoice, invoice, prompt_price, request_work

WORK = [HopWork("h", 0, 1, 100), HopWork("t", 2, 3, 100)]


def test_cached_prompt_tokens_are_billed_at_the_cached_price() -> None:
    bill = invoice(
        prompt_tokens=1500,
        completion_tokens=500,
        prompt_price_per_1k=Decimal("0.002"),
        completion_price_per_1k=Decimal("0.006"),
        fee_share=Decimal("0.10"),
        work=WORK,
        cached_tokens=1024,
        cached_price_per_1k=Decimal("0.0005"),
    )

    # (1500 - 1024) × 0.002 / 1000 + 1024 × 0.0005 / 1000 = 0.000952 + 0.000512
    assert bill.prompt_charge == Decimal("0.001464")
    assert bill.completion_charge == Decimal("0.003000")
    assert bill.charge == Decimal("0.004464")
    assert bill.network_fee == Decimal("0.000446")
    assert sum(s.amount for s in bill.shares) == Decimal("0.004018")


def test_without_a_cached_price_a_cached_token_costs_what_any_prompt_token_does() -> None:
    def bill(cached_tokens: int) -> Invoice:
        return invoice(
            prompt_tokens=333,
            completion_tokens=7,
            prompt_price_per_1k=Decimal("0.003"),
            completion_price_per_1k=Decimal("0.004"),
            fee_share=Decimal("0.05"),
            work=WORK,
            cached_tokens=cached_tokens,
        )

    assert bill(320) == bill(0)
    assert bill(320).prompt_charge == Decimal("0.000999")


def test_the_prompt_charge_is_rounded_once_and_never_counts_more_cached_than_prompt() -> None:
    # 1 × 0.0015 + 1 × 0.0005 = 0.002 per 1k: 0.000002, where rounding each part
    # (0.0000015 → 0.000002, 0.0000005 → 0.000001) would make 0.000003.
    assert prompt_price(2, Decimal("0.0015"), cached_tokens=1, cached_per_1k=Decimal("0.0005")) == (
        Decimal("0.000002")
    )
    assert prompt_price(10, Decimal("1"), cached_tokens=50, cached_per_1k=Decimal("0")) == Decimal(
        "0.000000"
    )
    assert isinstance(prompt_price(10, Decimal("1")), Decimal)


@dataclass
class Served:
    hops: tuple[HopWork, ...]
    replayed: int
    produced: int
    signature: str = ""
    cached: int = 0


def test_a_hop_is_paid_for_the_prompt_positions_it_computed_not_those_it_reused() -> None:
    route = Served(
        (HopWork("h", 0, 1, 0), HopWork("t", 2, 3, 0)), replayed=0, produced=5, cached=64
    )

    work = request_work(prompt_tokens=100, routes=[route])

    assert work == [HopWork("h", 0, 1, 100 - 64 + 5), HopWork("t", 2, 3, 100 - 64 + 5)]
    assert [w.units for w in work] == [41 * 2, 41 * 2]


def test_after_a_failover_each_route_is_paid_for_what_it_reused_itself() -> None:
    first = Served((HopWork("a", 0, 3, 0),), replayed=0, produced=6)  # failed: reported nothing
    last = Served((HopWork("b", 0, 3, 0),), replayed=6, produced=10, cached=32)

    work = request_work(prompt_tokens=40, routes=[first, last])

    assert work == [HopWork("a", 0, 3, 46), HopWork("b", 0, 3, 40 - 32 + 6 + 10)]
