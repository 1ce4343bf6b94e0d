"""Pricing and the split among hops: Decimal, exact to the last money unit."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracker_app.billing.pricing import MONEY, HopWork, invoice, request_work


def test_it_prices_prompt_and_completion_per_thousand_tokens() -> None:
    bill = invoice(
        prompt_tokens=1500,
        completion_tokens=500,
        prompt_price_per_1k=Decimal("0.002"),
        completion_price_per_1k=Decimal("0.006"),
        fee_share=Decimal("0.10"),
        work=[HopWork("a", 0, 14, 2000), HopWork("b", 15, 29, 2000)],
    )

    assert bill.prompt_charge == Decimal("0.003000")
    assert bill.completion_charge == Decimal("0.003000")
    assert bill.charge == Decimal("0.006000")
    assert bill.network_fee == Decimal("0.000600")
    assert [s.amount for s in bill.shares] == [Decimal("0.002700"), Decimal("0.002700")]


def test_work_units_are_tokens_times_the_layers_each_hop_ran() -> None:
    # ADR-0020's hybrid route: a 22-layer head and an 8-layer tail.
    head, tail = HopWork("gpu", 0, 21, 100), HopWork("cpu", 22, 29, 100)

    bill = invoice(
        prompt_tokens=60,
        completion_tokens=40,
        prompt_price_per_1k=Decimal("1"),
        completion_price_per_1k=Decimal("1"),
        fee_share=Decimal("0"),
        work=[head, tail],
    )

    assert (head.units, tail.units) == (2200, 800)
    assert [s.amount for s in bill.shares] == [Decimal("0.073333"), Decimal("0.026667")]


@given(
    prompt=st.integers(0, 100_000),
    completion=st.integers(0, 100_000),
    fee=st.decimals(min_value=0, max_value=Decimal("0.5"), places=3),
    hops=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 5000)), min_size=1, max_size=6),
)
def test_shares_always_sum_exactly_to_the_charge_minus_the_fee(
    prompt: int, completion: int, fee: Decimal, hops: list[tuple[int, int]]
) -> None:
    work = [HopWork(f"n{i}", 0, layers - 1, tokens) for i, (layers, tokens) in enumerate(hops)]

    bill = invoice(
        prompt_tokens=prompt,
        completion_tokens=completion,
        prompt_price_per_1k=Decimal("0.000137"),
        completion_price_per_1k=Decimal("0.000411"),
        fee_share=fee,
        work=work,
    )

    assert sum((s.amount for s in bill.shares), Decimal(0)) == bill.charge - bill.network_fee
    assert all(s.amount >= 0 and s.amount == s.amount.quantize(MONEY) for s in bill.shares)


def test_a_request_without_work_cannot_be_invoiced() -> None:
    with pytest.raises(ValueError, match="at least one hop"):
        invoice(
            prompt_tokens=1,
            completion_tokens=1,
            prompt_price_per_1k=Decimal(1),
            completion_price_per_1k=Decimal(1),
            fee_share=Decimal(0),
            work=[],
        )


@dataclass
class Served:
    hops: tuple[HopWork, ...]
    replayed: int
    produced: int
    signature: str = ""
    cached: int = 0


def hops(*spans: tuple[str, int, int]) -> tuple[HopWork, ...]:
    return tuple(HopWork(node, start, end, 0) for node, start, end in spans)


def test_each_hop_of_a_route_works_over_the_prompt_and_every_token_it_saw() -> None:
    work = request_work(prompt_tokens=10, routes=[Served(hops(("h", 0, 14), ("t", 15, 29)), 0, 40)])

    assert work == [HopWork("h", 0, 14, 50), HopWork("t", 15, 29, 50)]
    assert [w.units for w in work] == [50 * 15, 50 * 15]


def test_after_a_failover_both_routes_are_paid_and_the_replay_counts_for_the_second() -> None:
    first = Served(hops(("h", 0, 14), ("dead", 15, 29)), replayed=0, produced=6)
    idle = Served(hops(("busy", 0, 29)), replayed=6, produced=0)  # failed before a token
    last = Served(hops(("whole", 0, 29)), replayed=6, produced=20)

    work = request_work(prompt_tokens=10, routes=[first, idle, last])

    assert work == [
        HopWork("h", 0, 14, 16),
        HopWork("dead", 15, 29, 16),
        HopWork("whole", 0, 29, 36),
    ]


def test_the_route_that_finished_is_paid_even_without_new_tokens() -> None:
    work = request_work(prompt_tokens=10, routes=[Served(hops(("w", 0, 29)), 8, 0)])

    assert work == [HopWork("w", 0, 29, 18)]


def test_each_unit_of_work_names_the_route_it_was_part_of() -> None:
    first = Served(
        hops(("h", 0, 14), ("t", 15, 29)), replayed=0, produced=6, signature="m | h -> t"
    )
    last = Served(hops(("w", 0, 29)), replayed=6, produced=20, signature="m | w")

    work = request_work(prompt_tokens=10, routes=[first, last])

    assert [unit.route_signature for unit in work] == ["m | h -> t", "m | h -> t", "m | w"]
