"""How many layers of a model this node's memory holds (``runnode --layers auto``, ADR-0019).

A shard's memory is its weights plus the KV budget it admits sessions for
(ADR-0010). The weights are counted from the checkpoint's own config, on a
model built on the ``meta`` device (no memory, nothing read): each decoder
layer's parameters, and the *ends* (embeddings, final norm, LM head, a
family's per-layer inputs), at the bytes per weight the precision stores
(``--dtype``; ``--quantize`` int8 one byte, int4 half a byte for the decoder
layers' matrices, ``nodes_app.runtime.loading.quantization``). The count is
conservative: it reserves both ends, whichever range the node is given.

The memory is ``--memory-gb`` when given, else what is free now: available
RAM on CPU, the GPU's free memory on CUDA. The KV budget is ``--kv-budget``
when given, else half that memory (the runtime's default share).
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil
import torch
from transformers import AutoModelForCausalLM

from nodes_app.runtime.engine.kv import DEFAULT_BUDGET_SHARE
from nodes_app.runtime.loading.quantization import resolve_dtype
from nodes_app.runtime.loading.shard import load_config
from nodes_app.shared.sources import ModelSource

MIB = 2**20
# Bytes per weight of a decoder layer's matrices under each --quantize scheme (None: the dtype's).
QUANTIZED_BYTES: dict[str, float | None] = {"none": None, "int8": 1.0, "int4": 0.5}


@dataclass(frozen=True, slots=True)
class ModelFootprint:
    """A model's weights in memory at one precision: per decoder layer and at its ends."""

    num_layers: int
    layer_bytes: int  # the largest decoder layer
    ends_bytes: int  # embeddings, final norm, LM head (once when tied)


@dataclass(frozen=True, slots=True)
class MemoryHold:
    """What ``memory_bytes`` holds of a model once ``kv_budget_bytes`` is set aside."""

    footprint: ModelFootprint
    memory_bytes: int
    kv_budget_bytes: int

    @property
    def layers(self) -> int:
        """Whole decoder layers that fit with both ends (0: none), at most the model's."""
        room = self.memory_bytes - self.kv_budget_bytes - self.footprint.ends_bytes
        if room < self.footprint.layer_bytes:
            return 0
        return min(self.footprint.num_layers, room // max(1, self.footprint.layer_bytes))

    def summary(self) -> str:
        """The arithmetic, for the operator: what the memory is and what it holds."""
        return (
            f"{self.memory_bytes / MIB:.1f} MiB holds {self.layers} of "
            f"{self.footprint.num_layers} layers ({self.footprint.layer_bytes / MIB:.2f} MiB "
            f"each, {self.footprint.ends_bytes / MIB:.1f} MiB of embeddings and LM head, "
            f"{self.kv_budget_bytes / MIB:.1f} MiB KV budget)"
        )


def model_footprint(
    source: ModelSource, *, dtype: str, quantize: str, device: str
) -> ModelFootprint:
    """Count the weights of ``source`` as ``load_shard`` would hold them; nothing is loaded."""
    config = load_config(source)
    stored = resolve_dtype(dtype, torch.device(device))
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, dtype=stored)
    num_layers = int(config.num_hidden_layers)
    per_layer = [0] * num_layers
    ends = 0
    quantized = QUANTIZED_BYTES.get(quantize)
    seen: set[int] = set()
    for name, parameter in skeleton.named_parameters(remove_duplicate=False):
        if id(parameter) in seen:  # a tied LM head is the embedding table
            continue
        seen.add(id(parameter))
        size = parameter.numel() * parameter.element_size()
        layer = _layer_of(name)
        if layer is None:
            if quantize != "none" and parameter.dim() == 2:
                size = parameter.numel()  # int8 tables (the LM head, the embeddings)
            ends += size
            continue
        if quantized is not None and parameter.dim() == 2:
            size = int(parameter.numel() * quantized)
        per_layer[layer] += size
    return ModelFootprint(num_layers=num_layers, layer_bytes=max(per_layer), ends_bytes=ends)


def memory_free(device: str) -> int:
    """Bytes free for a shard now: available RAM, or the CUDA device's free memory."""
    if device == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        return int(free)
    return int(psutil.virtual_memory().available)


def memory_hold(
    footprint: ModelFootprint, *, memory_bytes: int, kv_budget_bytes: int | None
) -> MemoryHold:
    """The hold of ``memory_bytes``, the KV budget half of it unless given."""
    kv = int(memory_bytes * DEFAULT_BUDGET_SHARE) if kv_budget_bytes is None else kv_budget_bytes
    return MemoryHold(footprint=footprint, memory_bytes=memory_bytes, kv_budget_bytes=kv)


def _layer_of(name: str) -> int | None:
    """The decoder layer a parameter belongs to (``model.layers.N.…``), None for the ends."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return None
