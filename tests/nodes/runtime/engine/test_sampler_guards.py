"""The sampler: it samples every range a node accepts, and never answers token 0 for NaN.

A node range-checks sampling parameters (the protocol's one set of ranges,
the tracker's too) and its sampler refuses logits that are not finite
instead of answering a token; parameters at the edges of float32 still keep
the best token.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings

from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.sampling import (
    SEED_MAX,
    TEMPERATURE_MAX,
    TOP_K_MAX,
    TOP_P_MIN,
    SamplingParams,
)
from nodes_app.runtime.engine.sampler import new_generator, sample_token
from nodes_app.runtime.faults import NonFiniteOutput
from tests.support.sampling_values import SAMPLING

PROMPT = [{"role": "user", "content": "Tell me about meshes."}]
VOCAB = 259  # the tiny model's


@settings(max_examples=400, deadline=None)
@given(SAMPLING)
def test_sampling_a_node_accepts_is_in_range_and_never_fails_to_sample(
    fields: dict[str, Any],
) -> None:
    try:
        params = SamplingParams.from_mapping(fields)
    except ProtocolError as error:
        assert error.code == "bad_sampling"
        return
    assert 0.0 <= params.temperature <= TEMPERATURE_MAX
    assert TOP_P_MIN <= params.top_p <= 1.0
    assert 0 <= params.top_k <= TOP_K_MAX
    assert params.seed is None or 0 <= params.seed <= SEED_MAX
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0))
    assert 0 <= sample_token(logits, params, new_generator(params.seed)) < VOCAB


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_the_sampler_refuses_logits_that_are_not_finite_instead_of_answering_token_0(
    temperature: float, bad: float
) -> None:
    logits = torch.zeros(VOCAB)
    logits[5] = bad
    with pytest.raises(NonFiniteOutput):
        sample_token(logits, SamplingParams(temperature=temperature, seed=1), new_generator(1))
    with pytest.raises(NonFiniteOutput):
        sample_token(torch.full((VOCAB,), math.nan), SamplingParams(), new_generator(1))


def test_a_top_p_float32_rounds_to_zero_still_keeps_the_best_token() -> None:
    # Built without validation, as an old tracker might have sent it.
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(3))
    params = SamplingParams(temperature=1.0, top_p=1e-46, seed=2)
    assert sample_token(logits, params, new_generator(2)) == int(logits.argmax())


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-40])
def test_a_temperature_next_to_zero_samples_the_best_token(temperature: float) -> None:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(4))
    params = SamplingParams(temperature=temperature, seed=3)
    assert sample_token(logits, params, new_generator(3)) == int(logits.argmax())
