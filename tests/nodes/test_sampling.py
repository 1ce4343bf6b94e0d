"""The last hop's token choice: greedy, seeded sampling, top-k and top-p cut-offs."""

from __future__ import annotations

import torch

from nodes_app.runtime.sampling import SamplingParams, new_generator, sample_token

LOGITS = torch.tensor([0.1, 3.0, 2.9, -1.0, 0.5])


def draws(params: SamplingParams, count: int = 200) -> list[int]:
    generator = new_generator(params.seed)
    return [sample_token(LOGITS, params, generator) for _ in range(count)]


def test_temperature_zero_picks_the_highest_logit() -> None:
    assert draws(SamplingParams(temperature=0.0), 5) == [1] * 5


def test_top_k_one_is_greedy_whatever_the_temperature() -> None:
    assert draws(SamplingParams(temperature=5.0, top_k=1, seed=3), 20) == [1] * 20


def test_the_same_seed_draws_the_same_tokens() -> None:
    params = SamplingParams(temperature=1.5, seed=1234)
    assert draws(params) == draws(params)


def test_different_seeds_draw_different_sequences() -> None:
    assert draws(SamplingParams(temperature=1.5, seed=1)) != draws(
        SamplingParams(temperature=1.5, seed=2)
    )


def test_top_k_never_draws_outside_the_k_best() -> None:
    assert set(draws(SamplingParams(temperature=2.0, top_k=2, seed=7))) == {1, 2}


def test_top_p_keeps_the_smallest_set_that_reaches_the_mass() -> None:
    # Tokens 1 and 2 hold ~90 % of the mass at temperature 1; top_p 0.5 keeps token 1
    # and, since the mass before token 2 is below 0.5, token 2 as well — nothing else.
    assert set(draws(SamplingParams(temperature=1.0, top_p=0.5, seed=11))) == {1, 2}


def test_a_tiny_top_p_still_keeps_the_best_token() -> None:
    assert set(draws(SamplingParams(temperature=1.0, top_p=1e-6, seed=5), 50)) == {1}
