"""What a node's memory holds of a model (nodes_app.runtime.loading.footprint), counted from the
checkpoint's config without loading it."""

from __future__ import annotations

from nodes_app.runtime.loading.footprint import ModelFootprint, memory_hold, model_footprint
from nodes_app.runtime.loading.tiny import tiny_state_dict
from nodes_app.shared.sources import resolve_source

TINY = "tiny-random-llama"


def test_the_tiny_models_layers_and_ends_weigh_what_its_float32_weights_do() -> None:
    weights = tiny_state_dict()
    layer = sum(t.numel() for name, t in weights.items() if name.startswith("model.layers.0."))
    ends = sum(t.numel() for name, t in weights.items() if not name.startswith("model.layers."))

    footprint = model_footprint(
        resolve_source(TINY), dtype="float32", quantize="none", device="cpu"
    )

    assert footprint == ModelFootprint(num_layers=4, layer_bytes=layer * 4, ends_bytes=ends * 4)


def test_lower_precision_holds_more_layers_in_the_same_memory() -> None:
    source = resolve_source(TINY)
    full = model_footprint(source, dtype="float32", quantize="none", device="cpu")
    half = model_footprint(source, dtype="bfloat16", quantize="none", device="cpu")
    int8 = model_footprint(source, dtype="bfloat16", quantize="int8", device="cpu")
    assert full.layer_bytes == 2 * half.layer_bytes
    assert int8.layer_bytes < half.layer_bytes


def test_the_kv_budget_and_both_ends_come_off_the_memory_before_layers() -> None:
    mib = 2**20
    footprint = ModelFootprint(num_layers=30, layer_bytes=10 * mib, ends_bytes=100 * mib)

    def held(memory: int, kv: int | None = None) -> int:
        kv_bytes = None if kv is None else kv * mib
        return memory_hold(footprint, memory_bytes=memory * mib, kv_budget_bytes=kv_bytes).layers

    assert held(1000) == 30  # half of it is the KV budget: 400 MiB of layers, capped at 30
    assert held(400) == 10
    assert held(400, kv=250) == 5
    assert held(400, kv=295) == 0
    hold = memory_hold(footprint, memory_bytes=400 * mib, kv_budget_bytes=250 * mib)
    assert hold.summary() == (
        "400.0 MiB holds 5 of 30 layers (10.00 MiB each, 100.0 MiB of embeddings and LM head, "
        "250.0 MiB KV budget)"
    )
