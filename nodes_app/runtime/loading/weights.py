"""Which checkpoint tensors a shard needs, and reading them as transformers loads them.

A checkpoint's names are not always the module's: transformers renames keys
and fuses per-expert weights while it loads (``mlp.experts.0.down_proj.weight``
× N on disk becomes one ``mlp.experts.down_proj``). Safetensors checkpoints
therefore go through transformers' own conversion mapping for the model
(its ``WeightRenaming`` / ``WeightConverter`` list), but only after every
checkpoint key is renamed and the keys a shard does not need are dropped, so
a node of half the layers reads about half the file. GGUF files go through
transformers' GGUF name map and come out in the node's dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

from nodes_app.shared.model_errors import ModelSourceError, UnsupportedModelError
from nodes_app.shared.sources import ModelSource

# Modules beside the decoder layers that turn token ids into a layer's inputs.
# Gemma 4 feeds every layer a per-layer embedding of the ids: every hop computes
# its layers' own from the step's ids (ADR-0012), so every hop loads these and
# the token embeddings they project.
PER_LAYER_INPUT_MODULES = (
    "embed_tokens_per_layer",
    "per_layer_model_projection",
    "per_layer_projection_norm",
)


def shard_needs(
    name: str, *, start: int, end: int, is_last: bool, tied: bool, per_layer_inputs: bool = False
) -> bool:
    """Whether a shard ``start..end`` needs the tensor ``name`` (a module state-dict key).

    ``per_layer_inputs``: the family's layers take per-layer embeddings of the
    token ids (``Family.per_layer_inputs``), which every hop computes itself.

    Raises :class:`UnsupportedModelError` for a module this loader cannot place
    on a hop, rather than leaving it unloaded.
    """
    parts = name.split(".")
    if name.startswith("model.layers."):
        return start <= int(parts[2]) <= end
    if name == "model.embed_tokens.weight":
        # The last hop of a tied model uses the embedding matrix as its LM head.
        return start == 0 or (is_last and tied) or per_layer_inputs
    if parts[0] == "model" and parts[1] in PER_LAYER_INPUT_MODULES:
        return per_layer_inputs
    if name.startswith("model.norm."):
        return is_last
    if name.startswith("lm_head."):
        return is_last and not tied
    raise UnsupportedModelError(f"the shard loader does not know which hop needs {name}")


def parameter_dtypes(skeleton: nn.Module, dtype: torch.dtype) -> Callable[[str], torch.dtype]:
    """The dtype each parameter loads in: ``dtype``, or float32 where the model keeps it so.

    transformers keeps some modules in float32 when a model loads in a half
    precision (DeepSeek V3's router always; GPT-OSS's norms under float16):
    the model's own keep-in-float32 plan for ``dtype``, matched on names as
    its loading matches them.
    """
    from transformers.core_model_loading import build_glob_alternation

    plan: dict[str, torch.dtype] = skeleton._get_dtype_plan(dtype)  # type: ignore[operator]
    if not plan:
        return lambda name: dtype
    alternation, globs, _ = build_glob_alternation(list(plan))

    def dtype_of(name: str) -> torch.dtype:
        match = alternation.search(name)
        return plan[globs[match.lastgroup]] if match and match.lastgroup else dtype

    return dtype_of


def read_tensors(
    source: ModelSource,
    config: PretrainedConfig,
    skeleton: nn.Module,
    wanted: set[str],
    *,
    dtype: torch.dtype,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors ``wanted`` (state-dict names of ``skeleton``), read from a local ``source``.

    Each comes out with the name and value transformers' ``from_pretrained``
    gives that parameter, floating ones in ``dtype`` (cast as each is read, so
    a bfloat16 node never holds a float32 copy of its shard) or in float32
    where the model keeps them so (:func:`parameter_dtypes`). Names the
    checkpoint lacks are not yielded: the caller says what is missing.
    """
    if source.kind == "builtin":
        from nodes_app.runtime.loading import tiny

        dtype_of = parameter_dtypes(skeleton, dtype)
        for name, tensor in tiny.tiny_state_dict().items():
            if name in wanted:
                yield name, tensor.to(dtype_of(name))
    elif source.kind == "gguf":
        yield from read_gguf(Path(source.location), config, skeleton, wanted, dtype=dtype)
    elif source.kind == "directory":
        yield from read_safetensors(Path(source.location), skeleton, wanted, dtype=dtype)
    else:
        raise ModelSourceError(f"source {source} is not local: resolve it to a directory first")


def compute_unsaved_buffers(model: nn.Module, module: nn.Module, device: torch.device) -> None:
    """Give ``module``'s buffers that no checkpoint holds the values ``from_pretrained`` gives.

    Such buffers (Gemma's embedding scale, say) are not in the state dict, so
    they stay on ``meta`` after loading. transformers computes them with the
    model's ``_init_weights``, which skips tensors flagged as loaded; the same
    here, so the loaded weights are left as they are.
    """
    pending = [
        (owner, name, buffer)
        for owner in module.modules()
        for name, buffer in owner.named_buffers(recurse=False)
        if buffer.is_meta
    ]
    if not pending:
        return
    for tensor in [*module.parameters(), *module.buffers()]:
        tensor._is_hf_initialized = True  # type: ignore[attr-defined]
    for owner, name, buffer in pending:
        owner._buffers[name] = torch.empty_like(buffer, device=device)
    for owner in {id(owner): owner for owner, _, _ in pending}.values():
        model._init_weights(owner)  # type: ignore[operator]


@dataclass
class ReadPlan:
    """What to read from a checkpoint for a set of wanted parameters, and how to convert it.

    ``sources`` maps each target parameter (for a fused target, the first of
    its converter's targets) to the checkpoint keys it is made from, in the
    order transformers stacks them; ``converters`` holds that target's own
    copy of transformers' ``WeightConverter`` (absent for a plain or renamed
    tensor) and ``patterns`` the converter's source pattern each key matched.
    """

    sources: dict[str, list[str]] = field(default_factory=dict)
    converters: dict[str, Any] = field(default_factory=dict)
    patterns: dict[str, str] = field(default_factory=dict)

    @property
    def checkpoint_keys(self) -> set[str]:
        return {key for keys in self.sources.values() for key in keys}


def plan_reads(checkpoint_keys: list[str], skeleton: nn.Module, wanted: set[str]) -> ReadPlan:
    """Rename every checkpoint key as transformers would, keeping those ``wanted`` needs.

    The renaming is transformers' own (``rename_source_key`` over the model's
    conversion mapping), so a per-expert key lands on its fused parameter and
    is kept or dropped by that parameter's layer, before anything is read.
    """
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (
        WeightConverter,
        WeightRenaming,
        dot_natural_key,
        rename_source_key,
    )

    transforms = get_model_conversion_mapping(skeleton)  # type: ignore[arg-type]
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    by_pattern = {pattern: c for c in converters for pattern in c.source_patterns}
    meta = skeleton.state_dict()
    prefix = getattr(skeleton, "base_model_prefix", None)
    plan = ReadPlan()
    # Natural order (experts.2 before experts.10): the order MergeModulelist stacks in.
    for key in sorted(checkpoint_keys, key=dot_natural_key):
        target, pattern = rename_source_key(key, renamings, converters, prefix, meta)
        if target not in meta and key in meta:
            target, pattern = key, None
        if target not in wanted:
            continue
        plan.sources.setdefault(target, []).append(key)
        if pattern is not None:
            plan.converters.setdefault(target, deepcopy(by_pattern[pattern]))
            plan.patterns[key] = pattern
    return plan


def read_safetensors(
    directory: Path, skeleton: nn.Module, wanted: set[str], *, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """``wanted`` parameters from the ``*.safetensors`` files in ``directory``, converted."""
    from safetensors import safe_open

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelSourceError(f"{directory} holds no *.safetensors files")
    with ExitStack() as stack:
        handles = {}
        for file in files:
            handle = stack.enter_context(safe_open(str(file), framework="pt"))
            handles.update(dict.fromkeys(handle.keys(), handle))
        plan = plan_reads(list(handles), skeleton, wanted)
        dtype_of = parameter_dtypes(skeleton, dtype)

        def reader(key: str) -> Callable[[], torch.Tensor]:
            def read() -> torch.Tensor:
                tensor = handles[key].get_tensor(key)
                return tensor.to(dtype_of(key)) if tensor.is_floating_point() else tensor

            return read

        for target, keys in plan.sources.items():
            converter = plan.converters.get(target)
            if converter is None:
                yield target, reader(keys[0])()
                continue
            for key in keys:
                converter.add_tensor(target, key, plan.patterns[key], reader(key))
            converted = converter.convert(target, model=skeleton, config=skeleton.config)
            for name, value in converted.items():
                if name in wanted:
                    yield name, value[0] if isinstance(value, list) else value


def read_gguf(
    path: Path,
    config: PretrainedConfig,
    skeleton: nn.Module,
    wanted: set[str],
    *,
    dtype: torch.dtype,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``wanted`` parameters from a GGUF file, in ``dtype``.

    F32, F16 and BF16 tensors convert straight to ``dtype``; quantised blocks
    are de-quantised by gguf, which gives float32, one tensor at a time, then
    cast.
    """
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    from transformers.integrations.gguf.reader import GgufHeader, load_gguf_state_dict
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        LlamaTensorProcessor,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    # transformers' header reader maps the file and parses only the tensor table:
    # gguf.GGUFReader would also materialise every metadata array (~160 MB here).
    header = GgufHeader.from_file(str(path))
    raw = load_gguf_state_dict(header)
    shapes = {info.name: info.shape for info in header.tensors}
    # llama.cpp permutes q/k rows for its rotary layout; the processor undoes it.
    processor_class = TENSOR_PROCESSORS.get(config.model_type, TensorProcessor)
    processor = processor_class(config=config.to_dict())
    # These processors only move values, so they may run on the stored 16-bit
    # values; the others compute (e.g. Gemma's norm offset) and get float32.
    moves_only = processor_class in (TensorProcessor, LlamaTensorProcessor)
    with _gguf_name_table_built_once():
        gguf_to_hf = get_gguf_hf_weights_map(skeleton, processor)
    dtype_of = parameter_dtypes(skeleton, dtype)
    for gguf_name, lazy in raw.items():
        hf_name = gguf_to_hf.get(gguf_name)
        if hf_name is None or hf_name not in wanted:
            continue
        quant = GGMLQuantizationType(lazy.ggml_type)
        shape = shapes[gguf_name]
        stored = np.asarray(lazy.data)
        weights: np.ndarray
        if quant == GGMLQuantizationType.F32:
            weights = stored.view(np.float32).reshape(shape)
        elif quant == GGMLQuantizationType.F16 and moves_only:
            weights = stored.view(np.float16).reshape(shape)
        elif quant == GGMLQuantizationType.BF16 and moves_only:
            # numpy has no bfloat16: carry the bits as int16, reinterpret in torch.
            weights = stored.view(np.int16).reshape(shape)
        else:
            # Quantised blocks go to gguf as rows of bytes and come back float32.
            row_bytes = stored.size // max(1, int(np.prod(shape[:-1])))
            weights = dequantize(stored.reshape(*shape[:-1], row_bytes), quant).reshape(shape)
        weights = np.ascontiguousarray(processor.process(weights=weights, name=gguf_name).weights)
        if not weights.flags.writeable:  # a view of the mapped file: own a copy
            weights = weights.copy()
        tensor = torch.from_numpy(weights)
        if tensor.dtype == torch.int16:
            tensor = tensor.view(torch.bfloat16)
        yield hf_name, tensor.to(dtype_of(hf_name))


@contextmanager
def _gguf_name_table_built_once() -> Iterator[None]:
    """transformers maps GGUF names by walking every submodule, and rebuilds gguf's
    name table (~17 ms) at each one: about 400 times, 7 s of SmolLM2's 15 s load.
    The table depends only on its arguments (architecture, layer count), so one
    build serves the whole walk.
    """
    import gguf

    build = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.cache(build)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = build
