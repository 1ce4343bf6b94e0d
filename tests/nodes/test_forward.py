"""The binary hop step (``POST /v1/forward``) in process: good steps and every kind of bad input."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from starlette.testclient import TestClient

from nodes_app.runtime import wire
from nodes_app.runtime.loading import load_shard
from nodes_app.runtime.server import create_app
from nodes_app.runtime.service import NodeService
from nodes_app.runtime.sources import resolve_source
from nodes_app.runtime.trust import PlanGate
from tests.support.nodes import HIDDEN, forward_headers


def hidden_bytes(rows: int, seed: int = 0) -> bytes:
    generator = torch.Generator().manual_seed(seed)
    return wire.tensor_to_bytes(torch.randn(1, rows, HIDDEN, generator=generator))


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    """A tail node (layers 1-3 of the tiny model) served in process, dev-open (the
    signed-plan checks are tests/security's)."""
    torch.set_num_threads(1)
    shard = load_shard(
        model_key="tiny-random-llama",
        source=resolve_source("tiny-random-llama"),
        start=1,
        end=3,
        progress=False,
    )
    with TestClient(
        create_app(NodeService(shard, node_id="in-process", gate=PlanGate(dev_open=True)))
    ) as test_client:
        yield test_client


def test_a_prefill_then_decode_steps_return_tokens(client: TestClient) -> None:
    first = client.post("/v1/forward", content=hidden_bytes(5), headers=forward_headers("a", 5))
    assert first.status_code == 200
    assert isinstance(first.json()["token_id"], int)
    step = client.post(
        "/v1/forward", content=hidden_bytes(1), headers=forward_headers("a", 1, position=5)
    )
    assert step.status_code == 200
    assert client.delete("/v1/sessions/a").status_code == 204


def test_a_middle_hop_returns_hidden_states_in_the_wire_format(client: TestClient) -> None:
    response = client.post(
        "/v1/forward", content=hidden_bytes(4), headers=forward_headers("mid", 4, end=2)
    )
    assert response.status_code == 200
    assert response.headers[wire.DTYPE] == "float32"
    assert response.headers[wire.SHAPE] == f"1,4,{HIDDEN}"
    assert len(response.content) == 4 * HIDDEN * 4
    client.delete("/v1/sessions/mid")


@pytest.mark.parametrize(
    ("headers", "body", "code"),
    [
        (forward_headers("x", 3, dtype="float16"), hidden_bytes(1), "bad_length"),
        (forward_headers("x", 2, dtype="int8"), hidden_bytes(2), "bad_dtype"),
        (forward_headers("x", 2, shape="1,2,63"), hidden_bytes(2), "bad_shape"),
        (forward_headers("x", 2, shape="2,x"), hidden_bytes(2), "bad_shape"),
        (forward_headers("x", 3), hidden_bytes(2), "bad_length"),
        (forward_headers("x", 1, position=7), hidden_bytes(1), "unknown_session"),
        (forward_headers("x", 2, position=4095), hidden_bytes(2), "context_length_exceeded"),
        (forward_headers("x", 2, start=0), hidden_bytes(2), "layers_out_of_range"),
        (forward_headers("x", 2, start=2, end=4), hidden_bytes(2), "layers_out_of_range"),
        ({"X-Meshnet-Session": "x"}, hidden_bytes(2), "missing_header"),
    ],
)
def test_bad_input_is_refused_with_400_and_the_node_keeps_serving(
    client: TestClient, headers: dict[str, str], body: bytes, code: str
) -> None:
    response = client.post("/v1/forward", content=body, headers=headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    health = client.get("/v1/health").json()
    assert health["status"] == "ok"
    assert health["cached_sessions"] == 0
    good = client.post("/v1/forward", content=hidden_bytes(1), headers=forward_headers("ok", 1))
    assert good.status_code == 200
    client.delete("/v1/sessions/ok")


def test_hidden_states_in_another_float_dtype_are_cast_on_arrival(client: TestClient) -> None:
    # A GPU head in float16 handing over to this float32 node (ADR-0020's topology).
    half = torch.randn(1, 3, HIDDEN, generator=torch.Generator().manual_seed(3)).half()

    response = client.post(
        "/v1/forward",
        content=wire.tensor_to_bytes(half),
        headers=forward_headers("half", 3, dtype="float16"),
    )

    assert response.status_code == 200, response.text
    assert isinstance(response.json()["token_id"], int)
    client.delete("/v1/sessions/half")


def test_a_step_at_the_wrong_position_is_refused(client: TestClient) -> None:
    client.post("/v1/forward", content=hidden_bytes(3), headers=forward_headers("p", 3))
    skipped = client.post(
        "/v1/forward", content=hidden_bytes(1), headers=forward_headers("p", 1, position=4)
    )
    assert skipped.status_code == 400
    assert skipped.json()["error"]["code"] == "position_mismatch"
    client.delete("/v1/sessions/p")


def test_cancelling_an_unknown_session_is_404(client: TestClient) -> None:
    response = client.delete("/v1/sessions/never")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "unknown_session"
