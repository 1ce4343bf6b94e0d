"""Hidden states a broken node might send: what the hops' finiteness checks are shown."""

from __future__ import annotations

import math

import torch

from nodes_app.runtime.wire.tensors import tensor_to_bytes
from tests.support.link import HIDDEN


def nan_hidden(rows: int) -> bytes:
    """``rows`` positions of the tiny model's hidden states, one value NaN, as a hop's body."""
    hidden = torch.randn(1, rows, HIDDEN)
    hidden[0, 0, 7] = math.nan
    return tensor_to_bytes(hidden)
