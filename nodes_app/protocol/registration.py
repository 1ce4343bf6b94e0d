"""What a node reports about itself at registration and in heartbeats, and what it is told.

The bounds of its reported figures, its precision label (compute dtype and
weight quantisation as one string, :data:`PRECISIONS`), and the draft model
the registration answer names (:class:`DraftNamed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodes_app.protocol.errors import ProtocolError

# What a node may report about itself (registration, heartbeats): far above
# any real node, far below what overflows a database column.
MAX_REPORTED_SESSIONS = 100_000
MAX_REPORTED_QUEUE_DEPTH = 1_000_000
MAX_REPORTED_TPS = 1_000_000.0
MAX_REPORTED_PREFIX_HITS = 10**15
MAX_LAYERS = 10_000

# A node's precision (runnode --dtype / --quantize), reported at registration as
# one label: the dtype it computes in, then "+int8" when its weights are int8.
DTYPE_CHOICES = ("float32", "bfloat16", "float16")
QUANTIZE_CHOICES = ("none", "int8", "int4")
PRECISIONS = tuple(
    dtype if quantize == "none" else f"{dtype}+{quantize}"
    for dtype in DTYPE_CHOICES
    for quantize in QUANTIZE_CHOICES
)
DEFAULT_PRECISION = "float32"


def precision_label(dtype: str, quantize: str = "none") -> str:
    """What a node with ``dtype`` activations and ``quantize`` weights reports (PRECISIONS)."""
    label = dtype if quantize == "none" else f"{dtype}+{quantize}"
    if label not in PRECISIONS:
        raise ProtocolError(f"unknown precision {label!r}", code="bad_precision")
    return label


@dataclass(frozen=True)
class DraftNamed:
    """The model's draft model, as the registration answer names it (ADR-0028).

    ``weight_source`` is where the tracker reads its weights (a source string,
    ``nodes_app.shared.sources``); a node may load them from elsewhere.
    """

    key: str
    weight_source: str

    @classmethod
    def from_answer(cls, value: Any) -> DraftNamed | None:
        """The answer's ``draft`` field: None when it names none (or a tracker older than it)."""
        if not isinstance(value, dict):
            return None
        key, source = value.get("key"), value.get("weight_source")
        if not isinstance(key, str) or not isinstance(source, str) or not key or not source:
            raise ProtocolError("the registration answer names a draft without its key and weights")
        return cls(key, source)
