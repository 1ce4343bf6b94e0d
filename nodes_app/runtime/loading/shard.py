"""Load only the weights a shard needs, tensor by tensor, into transformers' own modules.

The model is built on the ``meta`` device (no memory), then the decoder layers
of the shard, and the embeddings / final norm / LM head when the shard's
range needs them, receive real tensors; every other module stays on ``meta``.
So a node serving half the layers holds about half the weights.
"""

from __future__ import annotations

import copy
import functools
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn
from tqdm import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from nodes_app.protocol.registration import precision_label
from nodes_app.runtime.engine.family_adapters import Family, family_of
from nodes_app.runtime.loading.memory import release_freed_memory
from nodes_app.runtime.loading.quantization import quantize_shard, resolve_dtype
from nodes_app.runtime.loading.weights import (
    PER_LAYER_INPUT_MODULES,
    compute_unsaved_buffers,
    parameter_dtypes,
    read_tensors,
    shard_needs,
)
from nodes_app.shared.model_errors import ModelSourceError
from nodes_app.shared.sources import ModelSource
from nodes_app.shared.tokenization import TokenizerUnavailable, model_text_of


@dataclass
class LoadedShard:
    """Layers ``start..end`` (inclusive) of a causal LM, plus the modules the range needs."""

    model_key: str
    config: PretrainedConfig
    family: Family
    start: int
    end: int
    layers: dict[int, nn.Module]
    rotary: nn.Module
    embed: nn.Module | None  # nn.Embedding, or an Int8Embedding when quantised
    norm: nn.Module | None
    lm_head: nn.Module | None
    tokenizer: Any | None
    device: torch.device
    dtype: torch.dtype
    load_seconds: float = 0.0
    rss_added_bytes: int = 0
    layer_types: list[str] = field(default_factory=list)
    # transformers' decoder module: only the parts this range needs hold weights (the
    # rest stays on ``meta``); a family's own inputs (Gemma 4's per-layer embeddings) live here.
    decoder: nn.Module | None = None
    quantize: str = "none"

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def is_last(self) -> bool:
        return self.end == self.num_layers - 1

    @property
    def precision(self) -> str:
        """``float32``, ``bfloat16+int8``…: the compute dtype, then the weights' quantisation."""
        return precision_label(str(self.dtype).removeprefix("torch."), self.quantize)

    def summary(self) -> str:
        return (
            f"loaded {self.model_key} layers {self.start}-{self.end} of {self.num_layers} "
            f"on {self.device} {self.precision} "
            f"in {self.load_seconds:.1f} s, +{self.rss_added_bytes / 2**20:.0f} MiB RSS"
        )


def load_config(source: ModelSource) -> PretrainedConfig:
    """The model's config alone, without its weights: ``num_hidden_layers`` is what
    registration needs. A fresh object on every call (loading sets its attention)."""
    if source.kind == "builtin":
        from nodes_app.runtime.loading import tiny

        _require_builtin(source)
        return tiny.tiny_config()
    if source.kind == "gguf":
        return copy.deepcopy(_gguf_config(source.location))
    return AutoConfig.from_pretrained(_local_directory(source))


@functools.cache
def _gguf_config(location: str) -> PretrainedConfig:
    """A GGUF file's config, read once per process: transformers reads every metadata
    field to build it, the tokenizer's arrays included (3-4 s for SmolLM2's 49,152
    tokens and merges), and a node placing itself reads it twice."""
    path = Path(location)
    return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)


def load_shard(
    *,
    model_key: str,
    source: ModelSource,
    start: int,
    end: int,
    device: str = "cpu",
    dtype: torch.dtype | str | None = None,
    quantize: str = "none",
    with_tokenizer: bool | None = None,
    progress: bool | None = None,
) -> LoadedShard:
    """Load layers ``start..end`` of ``source``; the tokenizer comes along for the head
    (``start`` 0: it tokenises prompts) and the last hop (it follows grammars, ADR-0022).

    ``progress`` draws a tqdm bar of the tensors read on stderr; None (the
    default) draws it only when stderr is a terminal, so logs stay one line
    per event. ``dtype`` (a torch dtype, a name or ``"auto"``) and ``quantize``
    set the shard's precision (``nodes_app.runtime.loading.quantization``).
    """
    if progress is None:
        progress = sys.stderr.isatty()
    began = time.perf_counter()
    rss_before = psutil.Process().memory_info().rss
    config = load_config(source)
    family = family_of(config)
    num_layers = int(config.num_hidden_layers)
    if not 0 <= start <= end < num_layers:
        raise ModelSourceError(
            f"layers {start}-{end} are outside the model's layers 0-{num_layers - 1}"
        )
    target = torch.device(device)
    dtype = resolve_dtype(dtype, target)
    config._attn_implementation = family.attention

    tokenizer = None
    if with_tokenizer if with_tokenizer is not None else start == 0 or end == num_layers - 1:
        # Before the weights, so the conversion's transient memory never stacks on them.
        tokenizer = load_tokenizer(source)

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, dtype=dtype)
    is_last = end == num_layers - 1
    tied = bool(getattr(config, "tie_word_embeddings", False))
    wanted = [
        name
        for name in skeleton.state_dict()
        if shard_needs(
            name,
            start=start,
            end=end,
            is_last=is_last,
            tied=tied,
            per_layer_inputs=family.per_layer_inputs,
        )
    ]
    tensors = dict(
        tqdm(
            read_tensors(_local(source), config, skeleton, set(wanted), dtype=dtype),
            total=len(wanted),
            desc=f"{model_key} layers {start}-{end}",
            unit="tensor",
            disable=not progress,
            file=sys.stderr,
        )
    )
    missing = sorted(set(wanted) - set(tensors))
    if missing:
        raise ModelSourceError(f"the weights lack {len(missing)} tensors, e.g. {missing[0]}")

    dtype_of = parameter_dtypes(skeleton, dtype)

    def materialise(module: nn.Module, prefix: str) -> nn.Module:
        own = {
            name[len(prefix) :]: tensors.pop(name).to(device=target, dtype=dtype_of(name))
            for name in list(tensors)
            if name.startswith(prefix)
        }
        module.load_state_dict(own, strict=True, assign=True)
        compute_unsaved_buffers(decoder, module, target)
        return module.eval()

    decoder = skeleton.model
    layers = {
        i: materialise(decoder.layers[i], f"model.layers.{i}.") for i in range(start, end + 1)
    }
    embed: nn.Embedding | None = None
    if "model.embed_tokens.weight" in tensors:
        embed = materialise(decoder.embed_tokens, "model.embed_tokens.")  # type: ignore[assignment]
    for name in PER_LAYER_INPUT_MODULES if family.per_layer_inputs else ():
        materialise(getattr(decoder, name), f"model.{name}.")
    norm = materialise(decoder.norm, "model.norm.") if is_last else None
    lm_head: nn.Module | None = None
    if is_last:
        if tied:
            assert embed is not None
            lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            lm_head.weight = embed.weight  # shared, not copied
        else:
            lm_head = materialise(skeleton.lm_head, "lm_head.")
    # The rotary module computes its buffers at construction: build a real one.
    rotary = type(decoder.rotary_emb)(config=config).to(target)

    shard = LoadedShard(
        model_key=model_key,
        config=config,
        family=family,
        start=start,
        end=end,
        layers=layers,
        rotary=rotary,
        embed=embed,
        norm=norm,
        lm_head=lm_head,
        tokenizer=tokenizer,
        device=target,
        dtype=dtype,
        layer_types=[family.layer_type(config, i) for i in range(num_layers)],
        decoder=decoder,
    )
    quantize_shard(shard, quantize)
    release_freed_memory()
    shard.load_seconds = time.perf_counter() - began
    shard.rss_added_bytes = max(0, psutil.Process().memory_info().rss - rss_before)
    return shard


def load_tokenizer(source: ModelSource) -> Any:
    """The tokenizer the tracker loads too (``nodes_app.shared.tokenization``), so both count alike.

    A source the torch-free loader cannot read (a hub id, a directory without
    ``tokenizer.json``) falls back to transformers' ``AutoTokenizer``; the
    tracker then caps a head's prompt count instead of counting it.
    """
    try:
        return model_text_of(source).tokenizer
    except TokenizerUnavailable:
        return AutoTokenizer.from_pretrained(_local_directory(source))


def _require_builtin(source: ModelSource) -> None:
    if source.location != "tiny-random-llama":
        raise ModelSourceError(f"no built-in model named {source.location!r}")


def _local(source: ModelSource) -> ModelSource:
    """``source`` with a hub id resolved to its downloaded directory."""
    if source.kind == "hub":
        return ModelSource("directory", _local_directory(source))
    return source


def _local_directory(source: ModelSource) -> str:
    if source.kind == "directory":
        return source.location
    if source.kind == "hub":
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            raise ModelSourceError(
                f"hub model {source.location} needs a download but HF_HUB_OFFLINE=1"
            )
        from huggingface_hub import snapshot_download

        return str(
            snapshot_download(
                source.location,
                allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"],
            )
        )
    raise ModelSourceError(f"source {source} is not a directory")


def load_causal_lm(source: ModelSource) -> nn.Module:
    """The whole model as transformers' own ``*ForCausalLM``, with the weights a node would load.

    The baseline the benchmarks compare the pipeline against (``generate`` in one process).
    """
    config = load_config(source)
    config._attn_implementation = family_of(config).attention
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    last = int(config.num_hidden_layers) - 1
    wanted = {
        name
        for name in model.state_dict()
        if shard_needs(name, start=0, end=last, is_last=True, tied=tied)
    }
    tensors = dict(read_tensors(_local(source), config, model, wanted, dtype=torch.float32))
    model.load_state_dict(tensors, strict=False, assign=True)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    compute_unsaved_buffers(model, model, torch.device("cpu"))
    still_meta = [name for name, p in model.named_parameters() if p.is_meta]
    if still_meta:
        raise ModelSourceError(f"the weights lack {still_meta[0]}")
    return model.eval()
