"""Tensor bytes on the link: the dtypes that travel and a tensor's raw bytes, both ways.

A step's hidden states and a middle hop's answer are ``T × H`` values,
little-endian, row-major, in one of :data:`DTYPES`; they never pass through
a frame's header (``frames``, ``compact``). Whether the values are finite is
not this module's concern: ``engine.finite`` is the one check.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from nodes_app.runtime.faults import RuntimeRequestError

if TYPE_CHECKING:
    from nodes_app.runtime.wire.entries import ForwardStep

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()


def body_length(step: ForwardStep) -> int:
    """Bytes a step's hidden states take on the wire."""
    return math.prod(step.shape) * DTYPES[step.dtype].itemsize


def tensor_from_bytes(body: bytes, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    torch_dtype = DTYPES[dtype]
    expected = math.prod(shape) * torch_dtype.itemsize
    if len(body) != expected:
        raise RuntimeRequestError(
            f"body has {len(body)} bytes; shape {list(shape)} of {dtype} needs {expected}",
            code="bad_length",
        )
    return torch.frombuffer(bytearray(body), dtype=torch_dtype).reshape(shape)
