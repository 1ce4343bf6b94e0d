"""The binary hop step: tensors to bytes and back, and the headers a node refuses."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nodes_app import protocol
from nodes_app.runtime import wire
from nodes_app.runtime.errors import RuntimeRequestError
from nodes_app.runtime.sampling import SamplingParams


def headers(**changes: Any) -> dict[str, str]:
    """Good step headers for 3 rows of hidden size 8, with ``changes`` applied (None drops)."""
    base = wire.step_headers(
        session_id="s-1",
        start=2,
        end=3,
        position=0,
        dtype="float32",
        shape=(1, 3, 8),
        sampling=SamplingParams(temperature=0.5, seed=9),
    )
    for name, value in changes.items():
        if value is None:
            base.pop(name)
        else:
            base[name] = value
    return base


def refused(raw: dict[str, str]) -> RuntimeRequestError:
    with pytest.raises(RuntimeRequestError) as caught:
        wire.parse_step_headers(raw)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize("dtype", sorted(wire.DTYPES))
def test_a_tensor_survives_the_trip_through_bytes(dtype: str) -> None:
    tensor = torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(1)).to(wire.DTYPES[dtype])
    step = wire.parse_step_headers(headers(**{protocol.DTYPE: dtype}))
    body = wire.tensor_to_bytes(tensor)

    assert len(body) == wire.body_length(step) == 3 * 8 * tensor.element_size()
    back = wire.tensor_from_bytes(body, dtype, step.shape)
    assert back.dtype == tensor.dtype
    assert torch.equal(back, tensor)


def test_the_headers_carry_the_step_and_its_sampling() -> None:
    step = wire.parse_step_headers(headers())

    assert (step.session_id, step.start, step.end, step.position) == ("s-1", 2, 3, 0)
    assert (step.dtype, step.shape) == ("float32", (1, 3, 8))
    assert step.sampling == SamplingParams(temperature=0.5, seed=9)
    assert wire.parse_step_headers(headers(**{protocol.SAMPLING: None})).sampling is None


def test_the_reservation_travels_when_the_head_gives_one_and_is_absent_otherwise() -> None:
    assert wire.parse_step_headers(headers()).reserve is None
    assert wire.parse_step_headers(headers(**{protocol.RESERVE: "300"})).reserve == 300
    assert refused(headers(**{protocol.RESERVE: "many"})).code == "bad_header"


def test_the_header_names_are_the_protocols() -> None:
    assert set(headers()) >= {
        "X-Meshnet-Session",
        "X-Meshnet-Start-Layer",
        "X-Meshnet-End-Layer",
        "X-Meshnet-Position",
        "X-Meshnet-Dtype",
        "X-Meshnet-Shape",
        "X-Meshnet-Sampling",
    }


def test_a_body_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(RuntimeRequestError) as caught:
        wire.tensor_from_bytes(bytes(4 * 8 * 3 - 1), "float32", (1, 3, 8))
    assert caught.value.code == "bad_length"


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({protocol.DTYPE: "int8"}, "bad_dtype"),
        ({protocol.SHAPE: "1,3"}, "bad_shape"),
        ({protocol.SHAPE: "2,3,8"}, "bad_shape"),
        ({protocol.SHAPE: "1,0,8"}, "bad_shape"),
        ({protocol.SHAPE: "1,x,8"}, "bad_shape"),
        ({protocol.POSITION: "-1"}, "bad_header"),
        ({protocol.START_LAYER: "two"}, "bad_header"),
        ({protocol.SESSION: "s" * (protocol.MAX_SESSION_ID + 1)}, "bad_header"),
        ({protocol.END_LAYER: None}, "missing_header"),
        ({protocol.SESSION: " "}, "missing_header"),
        ({protocol.SAMPLING: "{not json"}, "bad_sampling"),
        ({protocol.SAMPLING: '{"top_p": 2}'}, "bad_sampling"),
    ],
)
def test_bad_headers_are_refused_with_their_code(changes: dict[str, Any], code: str) -> None:
    assert refused(headers(**changes)).code == code
