"""What a node reports about itself at registration and in heartbeats.

The bounds of its reported figures and its precision label (compute dtype and
weight quantisation as one string, :data:`PRECISIONS`).
"""

from __future__ import annotations

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
