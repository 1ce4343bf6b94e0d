"""The last hop's token choice: greedy, seeded sampling, top-k and top-p cut-offs,
OpenAI's penalties and logit_bias, and the logprobs it reports."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nodes_app.protocol.sampling import PENALTY_MAX, PENALTY_MIN
from nodes_app.runtime.engine.sampler import (
    SamplingParams,
    TokenPicker,
    new_generator,
    prompt_scores,
    sample_token,
)
from nodes_app.runtime.wire.entries import Choice

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


# --- penalties and logit_bias (OpenAI's definitions), logprobs -------------------------

VOCAB = 8


@given(
    logits=st.lists(st.floats(-30, 30), min_size=VOCAB, max_size=VOCAB),
    counts=st.lists(st.integers(0, 5), min_size=VOCAB, max_size=VOCAB),
    presence=st.floats(PENALTY_MIN, PENALTY_MAX),
    frequency=st.floats(PENALTY_MIN, PENALTY_MAX),
    bias=st.dictionaries(st.integers(0, VOCAB - 1), st.floats(-100, 100), max_size=VOCAB),
)
def test_penalties_and_bias_change_each_logit_as_openai_defines(
    logits: list[float],
    counts: list[int],
    presence: float,
    frequency: float,
    bias: dict[int, float],
) -> None:
    params = SamplingParams(
        presence_penalty=presence,
        frequency_penalty=frequency,
        logit_bias=tuple(sorted(bias.items())),
    )
    # The counts are those of the tokens the completion was resumed with.
    resumed = [token for token, count in enumerate(counts) for _ in range(count)]
    adjusted = TokenPicker(params, generated_ids=resumed).adjusted(torch.tensor(logits))
    # mu[j] - c[j] * frequency - (c[j] > 0) * presence + bias[j]
    expected = [
        mu - c * frequency - (1.0 if c > 0 else 0.0) * presence + bias.get(j, 0.0)
        for j, (mu, c) in enumerate(zip(logits, counts, strict=True))
    ]
    assert adjusted.tolist() == pytest.approx(expected, abs=1e-3)


def test_a_bias_of_100_makes_greedy_choose_that_token() -> None:
    params = SamplingParams(logit_bias=((4, 100.0),))
    assert TokenPicker(params).choose(LOGITS).token_id == 4


def test_a_bias_of_minus_100_bans_the_best_token() -> None:
    params = SamplingParams(temperature=1.0, seed=3, logit_bias=((1, -100.0),))
    picker = TokenPicker(params)
    assert 1 not in {picker.choose(LOGITS).token_id for _ in range(200)}


def test_a_frequency_penalty_stops_a_token_from_repeating_once_it_costs_more_than_its_lead() -> (
    None
):
    # Token 1 leads token 2 by 0.1: once chosen, a frequency penalty of 0.5 sinks it.
    params = SamplingParams(frequency_penalty=0.5)
    picker = TokenPicker(params)
    chosen = [picker.choose(LOGITS).token_id for _ in range(4)]
    assert chosen[:2] == [1, 2]
    assert chosen.count(1) == 2  # after token 2 has paid as much, token 1 leads again


def test_a_presence_penalty_is_paid_once_whatever_the_count() -> None:
    params = SamplingParams(presence_penalty=0.5)
    picker = TokenPicker(params)
    chosen = [picker.choose(LOGITS).token_id for _ in range(4)]
    assert chosen == [1, 2, 1, 1]


@given(
    rows=st.lists(
        st.lists(st.floats(-5, 5), min_size=VOCAB, max_size=VOCAB), min_size=2, max_size=12
    ),
    cut=st.integers(0, 12),
    frequency=st.floats(-2, 2),
    presence=st.floats(-2, 2),
)
def test_a_resumed_completion_is_penalised_as_the_uninterrupted_one(
    rows: list[list[float]], cut: int, frequency: float, presence: float
) -> None:
    params = SamplingParams(frequency_penalty=frequency, presence_penalty=presence)
    logits = [torch.tensor(row) for row in rows]
    cut = min(cut, len(rows))
    whole = TokenPicker(params)
    uninterrupted = [whole.choose(row).token_id for row in logits]

    resumed = TokenPicker(params, generated_ids=uninterrupted[:cut])
    assert [resumed.choose(row).token_id for row in logits[cut:]] == uninterrupted[cut:]


def test_logprobs_are_the_models_own_whatever_the_temperature_penalties_and_bias() -> None:
    raw = torch.log_softmax(LOGITS, dim=-1)
    params = SamplingParams(
        temperature=1.7, seed=4, frequency_penalty=2.0, logit_bias=((0, 100.0),)
    )
    picker = TokenPicker(params)
    for _ in range(5):
        choice = picker.choose(LOGITS, logprobs=3)
        assert choice.token_id == 0  # the bias decides the token...
        assert choice.score is not None
        assert choice.score.logprob == pytest.approx(float(raw[0]))  # ...not its logprob
        assert [token for token, _ in choice.score.top] == [1, 2, 4]
        assert [value for _, value in choice.score.top] == pytest.approx(raw[[1, 2, 4]].tolist())


def test_greedy_chooses_its_best_alternative() -> None:
    choice = TokenPicker(SamplingParams()).choose(LOGITS, logprobs=1)
    assert choice.score is not None
    assert choice.score.top == ((choice.token_id, choice.score.logprob),)


def test_without_logprobs_a_choice_carries_no_score() -> None:
    assert TokenPicker(SamplingParams()).choose(LOGITS) == Choice(1)


def test_prompt_scores_give_each_targets_logprob_and_the_best_alternatives() -> None:
    logits = torch.stack([LOGITS, LOGITS.flip(0)])
    raw = torch.log_softmax(logits, dim=-1)
    first, second = prompt_scores(logits, [3, 0], 2)

    assert first.logprob == pytest.approx(float(raw[0, 3]))
    assert second.logprob == pytest.approx(float(raw[1, 0]))
    assert [token for token, _ in first.top] == [1, 2]
    assert [token for token, _ in second.top] == [3, 2]


# A draft round's logits: the last accepted token's position, then three drafts'.
ROUND = torch.randn(4, 32, generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("kept", [0, 1, 2, 3])
def test_a_round_scores_every_token_it_delivers_as_choosing_them_one_by_one_does(
    kept: int,
) -> None:
    params = SamplingParams(temperature=0.9, seed=5)
    plain = TokenPicker(params)
    one_by_one = [plain.choose(row, logprobs=2) for row in ROUND]
    chosen = [choice.token_id for choice in one_by_one]
    # The first ``kept`` drafts are what plain decoding chooses; the next one is not.
    drafts = chosen[:kept] + [(token + 1) % 32 for token in chosen[kept:3]]

    verified = TokenPicker(params).verify(ROUND, drafts, logprobs=2)

    assert verified.accepted == kept
    assert verified.token_id == chosen[kept]
    delivered = [*verified.accepted_scores, verified.score]
    assert delivered == [choice.score for choice in one_by_one[: kept + 1]]


def test_a_round_without_logprobs_scores_nothing() -> None:
    drafts = [TokenPicker(SamplingParams()).choose(row).token_id for row in ROUND[:3]]

    verified = TokenPicker(SamplingParams()).verify(ROUND, drafts)

    assert verified == Choice(verified.token_id, accepted=3)
