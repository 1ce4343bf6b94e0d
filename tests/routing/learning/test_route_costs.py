"""What a request costs on each route, learned from completed requests: a prompt token, an
answer token, an answer's length, and how far speculation carried it."""

from __future__ import annotations

import pytest

from routing_app.learning.route_costs import MIN_PREFILL_TOKENS, RouteCostBook
from routing_app.planning.search import enumerate_routes
from tests.support.routing import record

NODES = [record("head", 0, 14), record("tail-a", 15, 29), record("tail-b", 15, 29)]
VIA_A, VIA_B = sorted(
    enumerate_routes(model_key="m", num_layers=30, nodes=NODES), key=lambda p: p.node_ids
)


def test_a_route_learns_its_prompt_and_answer_token_costs_and_falls_back_on_its_model() -> None:
    book = RouteCostBook()
    book.timed(
        plan=VIA_A, prompt_computed=400, first_token_seconds=2.0, output_tokens=51, seconds=7.0
    )
    # A prompt mostly taken from the cache teaches nothing about prefill.
    book.timed(
        plan=VIA_A,
        prompt_computed=MIN_PREFILL_TOKENS - 1,
        first_token_seconds=1.0,
        output_tokens=1,
        seconds=1.0,
    )
    # After a failover the time to the first token is not this route's: only the length.
    book.timed(
        plan=VIA_A, prompt_computed=400, first_token_seconds=None, output_tokens=3, seconds=9
    )

    costs = book.costs(VIA_A)
    assert costs.prompt == pytest.approx(2.0 / 400)
    assert costs.answer == pytest.approx(5.0 / 50)
    after_two = 51 + 0.5 * (1 - 51)
    assert costs.answer_tokens == pytest.approx(after_two + (3 - after_two) / 3)
    assert book.costs(VIA_B).prompt == pytest.approx(2.0 / 400)  # the model's, for now
    assert book.costs(VIA_B).answer == pytest.approx(5.0 / 50)


def test_a_route_learns_how_far_speculation_carried_its_answers_and_keeps_it_its_own() -> None:
    book = RouteCostBook()
    assert book.costs(VIA_A).drafted is None

    book.timed(
        plan=VIA_A,
        prompt_computed=100,
        first_token_seconds=0.5,
        output_tokens=40,
        seconds=2.0,
        drafted=48,
        accepted=30,
    )

    costs = book.costs(VIA_A)
    assert (costs.drafted, costs.accepted) == (pytest.approx(1.2), pytest.approx(0.75))
    assert book.costs(VIA_B).accepted is None  # another route's speculation is its own
