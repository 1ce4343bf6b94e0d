"""Sampling parameters: their JSON form round-trips, and a value out of range is refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.sampling import LOGIT_BIAS_MAX_ENTRIES, SamplingParams, logit_bias_pairs


@given(
    st.dictionaries(
        st.integers(0, 10**9),
        st.floats(-100, 100, allow_nan=False),
        max_size=LOGIT_BIAS_MAX_ENTRIES,
    )
)
def test_any_logit_bias_in_range_survives_its_json_form(bias: dict[int, float]) -> None:
    params = SamplingParams(logit_bias=tuple(sorted(bias.items())))
    assert SamplingParams.from_mapping(json.loads(json.dumps(params.to_json()))) == params
    assert logit_bias_pairs({str(k): v for k, v in bias.items()}) == params.logit_bias


def test_sampling_params_round_trip_through_their_json() -> None:
    params = SamplingParams(temperature=1.2, top_p=0.5, top_k=3, seed=None)
    assert SamplingParams.from_mapping(params.to_json()) == params
    assert SamplingParams(temperature=0.0).greedy and SamplingParams(1.0, top_k=1).greedy


def test_sampling_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ProtocolError) as caught:
        SamplingParams.from_mapping("{temperature")
    assert caught.value.code == "bad_sampling"
