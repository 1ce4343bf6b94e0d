"""The binary node-to-node format: ``X-Meshnet-*`` headers for metadata, raw tensor bytes as body.

The header names and the session id limit are the protocol's
(:mod:`nodes_app.protocol`); the tensor codec needs torch, so it lives here.

Request ``POST /v1/forward``:
  X-Meshnet-Session      session id (one per generation)
  X-Meshnet-Start-Layer  first layer to run (may exceed this node's shard start)
  X-Meshnet-End-Layer    last layer to run (inclusive)
  X-Meshnet-Position     position of the first row (0 starts the session)
  X-Meshnet-Dtype        float32 | float16 | bfloat16 (must be the node's dtype)
  X-Meshnet-Shape        1,T,H  (comma-separated)
  X-Meshnet-Sampling     JSON {temperature, top_p, top_k, seed}: only when End-Layer is the last
  X-Meshnet-Sender       optional: the node that produced the body (named when it is refused)
  X-Meshnet-Reserve      optional: positions the session may reach (its KV reservation)
  body                   T*H little-endian values, row-major
Response: 200 with the same Dtype/Shape headers and the output hidden states as
the body, or, from the hop that ends at the last layer, JSON ``{"token_id": N}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from nodes_app.protocol import (
    DTYPE,
    END_LAYER,
    MAX_SESSION_ID,
    POSITION,
    RESERVE,
    SAMPLING,
    SENDER,
    SESSION,
    SHAPE,
    START_LAYER,
    ProtocolError,
    SamplingParams,
)
from nodes_app.runtime.errors import RuntimeRequestError

__all__ = [
    "DTYPE",
    "DTYPES",
    "DTYPE_NAMES",
    "END_LAYER",
    "POSITION",
    "RESERVE",
    "SAMPLING",
    "SENDER",
    "SESSION",
    "SHAPE",
    "START_LAYER",
    "ForwardStep",
    "body_length",
    "is_finite",
    "parse_step_headers",
    "step_headers",
    "tensor_from_bytes",
    "tensor_to_bytes",
]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


@dataclass(frozen=True)
class ForwardStep:
    session_id: str
    start: int
    end: int
    position: int
    dtype: str
    shape: tuple[int, int, int]
    sampling: SamplingParams | None
    sender: str | None = None
    # Positions the session may reach; None: the node's default (ADR-0010).
    reserve: int | None = None


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None or not value.strip():
        raise RuntimeRequestError(f"missing header {name}", code="missing_header")
    return value.strip()


def _int_header(headers: Mapping[str, str], name: str) -> int:
    value = _header(headers, name)
    try:
        number = int(value)
    except ValueError:
        raise RuntimeRequestError(f"{name} must be an integer", code="bad_header") from None
    if number < 0:
        raise RuntimeRequestError(f"{name} must not be negative", code="bad_header")
    return number


def parse_step_headers(headers: Mapping[str, str]) -> ForwardStep:
    session_id = _header(headers, SESSION)
    if len(session_id) > MAX_SESSION_ID:
        raise RuntimeRequestError("session id too long", code="bad_header")
    dtype = _header(headers, DTYPE)
    if dtype not in DTYPES:
        raise RuntimeRequestError(
            f"unknown dtype {dtype!r} (one of {', '.join(DTYPES)})", code="bad_dtype"
        )
    try:
        dims = tuple(int(part) for part in _header(headers, SHAPE).split(","))
    except ValueError:
        raise RuntimeRequestError(f"{SHAPE} must be 1,T,H", code="bad_shape") from None
    if len(dims) != 3 or dims[0] != 1 or dims[1] < 1 or dims[2] < 1:
        raise RuntimeRequestError(f"{SHAPE} must be 1,T,H with T >= 1", code="bad_shape")
    sampling_header = headers.get(SAMPLING)
    try:
        sampling = SamplingParams.from_header(sampling_header) if sampling_header else None
    except ProtocolError as error:
        raise RuntimeRequestError.refusing(error) from None
    return ForwardStep(
        session_id=session_id,
        start=_int_header(headers, START_LAYER),
        end=_int_header(headers, END_LAYER),
        position=_int_header(headers, POSITION),
        dtype=dtype,
        shape=(dims[0], dims[1], dims[2]),
        sampling=sampling,
        sender=(headers.get(SENDER) or "").strip()[:MAX_SESSION_ID] or None,
        reserve=_int_header(headers, RESERVE) if headers.get(RESERVE) else None,
    )


def step_headers(
    *,
    session_id: str,
    start: int,
    end: int,
    position: int,
    dtype: str,
    shape: tuple[int, ...],
    sampling: SamplingParams | None,
    sender: str | None = None,
    reserve: int | None = None,
) -> dict[str, str]:
    headers = {
        SESSION: session_id,
        START_LAYER: str(start),
        END_LAYER: str(end),
        POSITION: str(position),
        DTYPE: dtype,
        SHAPE: ",".join(str(d) for d in shape),
        "Content-Type": "application/octet-stream",
    }
    if sampling is not None:
        headers[SAMPLING] = sampling.to_header()
    if sender is not None:
        headers[SENDER] = sender
    if reserve is not None:
        headers[RESERVE] = str(reserve)
    return headers


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()


def body_length(step: ForwardStep) -> int:
    """Bytes a step's hidden states take on the wire."""
    return math.prod(step.shape) * DTYPES[step.dtype].itemsize


def is_finite(tensor: torch.Tensor) -> bool:
    """Whether every value is a number (no NaN, no infinity)."""
    return bool(torch.isfinite(tensor).all())


def tensor_from_bytes(body: bytes, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    torch_dtype = DTYPES[dtype]
    expected = math.prod(shape) * torch_dtype.itemsize
    if len(body) != expected:
        raise RuntimeRequestError(
            f"body has {len(body)} bytes; shape {list(shape)} of {dtype} needs {expected}",
            code="bad_length",
        )
    return torch.frombuffer(bytearray(body), dtype=torch_dtype).reshape(shape)
