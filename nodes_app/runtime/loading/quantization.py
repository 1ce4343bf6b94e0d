"""A shard's precision: the dtype it computes in and the weight-only quantisation of its weights.

``--dtype`` picks the dtype of activations and of every weight left unquantised
(``auto``: float32 on CPU, where exact split == whole comparisons need it, and
float16 on accelerators). ``--quantize int8`` stores the decoder layers' Linear
weights as int8 with one scale per output row (torchao's ``Int8WeightOnlyConfig``)
and, on the last hop, the LM head too; the embedding table is kept as int8 rows
as well (:class:`Int8Embedding`), so a tied model's largest matrix shrinks
fourfold on the head and on the tail. ``--quantize int4`` stores the decoder
layers' Linear weights as bitsandbytes NF4 instead (CPU only). ADR-0014 holds
the measurements behind the choice of libraries.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from nodes_app.protocol.registration import DTYPE_CHOICES, QUANTIZE_CHOICES
from nodes_app.shared.model_errors import UnsupportedModelError

if TYPE_CHECKING:
    from nodes_app.runtime.loading.shard import LoadedShard

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """The torch dtype ``dtype`` names on ``device``.

    None or ``"auto"``: float32 on CPU, float16 on accelerators. Raises
    ValueError for a name outside ``DTYPE_CHOICES``.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        # Exact split == whole comparisons need float32 on CPU; accelerators halve it.
        return torch.float32 if device.type == "cpu" else torch.float16
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} (one of {', '.join(DTYPE_CHOICES)})")
    return TORCH_DTYPES[dtype]


class Int8Embedding(nn.Module):
    """An embedding table stored as int8 rows with one float scale each.

    A lookup dequantises only the rows it reads: torchao's quantised tensors
    dequantise the whole table for ``F.embedding`` (50 ms a token for SmolLM2's).
    ``rows`` and ``scale`` may be a tied LM head's int8 weight (torchao's
    per-row ``qdata`` and ``scale``, symmetric), so the two share one table.
    """

    rows: torch.Tensor
    scale: torch.Tensor

    def __init__(self, rows: torch.Tensor, scale: torch.Tensor, *, dtype: torch.dtype) -> None:
        super().__init__()
        self.register_buffer("rows", rows)
        self.register_buffer("scale", scale.reshape(-1, 1))
        self.dtype = dtype

    @classmethod
    def quantising(cls, weight: torch.Tensor, *, dtype: torch.dtype) -> Int8Embedding:
        """A float table ``weight`` quantised to int8 rows, symmetric, one scale per row."""
        table = weight.detach().float()
        scale = table.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
        return cls(torch.round(table / scale).to(torch.int8), scale, dtype=dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return (self.rows[ids] * self.scale[ids]).to(self.dtype)


def quantize_shard(shard: LoadedShard, scheme: str) -> None:
    """Quantise ``shard``'s weights in place by ``scheme`` (one of ``QUANTIZE_CHOICES``).

    ``"none"`` leaves it as loaded. ``"int8"``: every ``nn.Linear`` of the
    decoder layers, the LM head and the embedding table become int8 weights
    with per-row scales (one table when the model ties them); activations,
    norms and rotary stay in the shard's dtype. ``"int4"``: the decoder
    layers' Linear weights become bitsandbytes NF4 (4-bit, CPU only), the
    LM head and embeddings int8 as above. Raises UnsupportedModelError for a
    scheme it cannot apply.
    """
    if scheme not in QUANTIZE_CHOICES:
        raise UnsupportedModelError(
            f"unknown quantisation {scheme!r} (one of {', '.join(QUANTIZE_CHOICES)})"
        )
    if scheme == "none":
        return
    if scheme == "int4" and shard.device.type != "cpu":
        raise UnsupportedModelError(
            f"--quantize int4 runs on cpu only (bitsandbytes' NF4), not {shard.device.type}; "
            "use --quantize int8 (see docs/adr/0014-precision-and-quantisation.md)"
        )
    quantize_, config = _torchao_int8()
    for layer in shard.layers.values():
        if scheme == "int4":
            _to_nf4(layer, dtype=shard.dtype)
        else:
            quantize_(layer, config)
    head = shard.lm_head
    table = shard.embed.weight if shard.embed is not None else None
    if head is not None and isinstance(table, torch.Tensor) and head.weight is table:
        # Tied: one int8 table serves as the LM head and, on a head, as the embedding.
        head = nn.Linear(table.shape[1], table.shape[0], bias=False, device="meta")
        head.weight = nn.Parameter(table.detach(), requires_grad=False)
        quantize_(head, config)
        int8: Any = head.weight  # torchao's Int8Tensor
        embed = Int8Embedding(int8.qdata, int8.scale, dtype=shard.dtype)
        # A tail loaded the table only as its LM head's weight.
        shard.embed = embed if shard.start == 0 else None
    else:
        if head is not None:
            quantize_(head, config)
        if isinstance(table, torch.Tensor):
            shard.embed = Int8Embedding.quantising(table, dtype=shard.dtype)
    shard.lm_head = head.eval() if head is not None else None
    shard.quantize = scheme


def _to_nf4(module: nn.Module, *, dtype: torch.dtype) -> None:
    """Replace every ``nn.Linear`` under ``module`` by bitsandbytes' NF4 ``Linear4bit``."""
    bnb = _bitsandbytes()
    for name, child in list(module.named_children()):
        if not isinstance(child, nn.Linear):
            _to_nf4(child, dtype=dtype)
            continue
        packed = bnb.nn.Linear4bit(
            child.in_features,
            child.out_features,
            bias=child.bias is not None,
            compute_dtype=dtype,
            quant_type="nf4",
            device="meta",
        )
        packed.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, quant_type="nf4")
        if child.bias is not None:
            packed.bias = nn.Parameter(child.bias.data, requires_grad=False)
        # Params4bit packs its weight when it is moved to a device.
        setattr(module, name, packed.to(child.weight.device).eval())


def _bitsandbytes() -> Any:
    """bitsandbytes, imported without its warnings (the hub's faster CPU kernel is
    absent; it still decorates with ``torch.jit.script_method``)."""
    with _quiet("bitsandbytes"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import bitsandbytes
    return bitsandbytes


@functools.cache
def _torchao_int8() -> tuple[Any, Any]:
    """torchao's ``quantize_`` and its int8 weight-only config, imported without its noise.

    On a CPU build of torch, torchao's import logs a warning for each CUDA
    kernel library it cannot load, and torch one for each enum it registers.
    """
    with _quiet("torchao", "torch.utils._pytree"):
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    return quantize_, Int8WeightOnlyConfig()


@contextlib.contextmanager
def _quiet(*names: str) -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
