"""A node's precision as command-line options, shared by ``runnode`` and ``python -m``.

Torch-free on purpose, like ``capacity``: ``manage.py runnode`` registers these
options when Django loads its commands, and torch must not load then. What the
options do is ``nodes_app.runtime.loading.quantization``'s (ADR-0014).
"""

from __future__ import annotations

import argparse

from nodes_app.protocol.registration import DTYPE_CHOICES, QUANTIZE_CHOICES


def add_precision_arguments(parser: argparse.ArgumentParser) -> None:
    """``--dtype`` and ``--quantize``; argparse refuses any other value, naming the choices."""
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", *DTYPE_CHOICES],
        help="dtype of activations and unquantised weights (default auto: float32 on CPU, "
        "float16 on cuda/mps)",
    )
    parser.add_argument(
        "--quantize",
        default="none",
        choices=QUANTIZE_CHOICES,
        help="weight-only quantisation: int8 (decoder layers, LM head and embeddings) or int4 "
        "(decoder layers NF4, CPU only; LM head and embeddings int8); default none (ADR-0014)",
    )
