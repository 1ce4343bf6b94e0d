"""The shard loader and runner in process, on the tiny model."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from nodes_app.runtime.engine.runner import ShardRunner
from nodes_app.runtime.loading.shard import load_shard
from nodes_app.runtime.loading.tiny import tiny_config, tiny_state_dict
from nodes_app.shared.model_errors import ModelSourceError, UnsupportedModelError
from nodes_app.shared.sources import ModelSource, resolve_source

TINY = "tiny-random-llama"


def shard(start: int, end: int):
    return load_shard(
        model_key=TINY, source=resolve_source(TINY), start=start, end=end, progress=False
    )


def parameters(loaded) -> int:
    modules = [*loaded.layers.values(), loaded.embed, loaded.norm, loaded.lm_head]
    seen = {id(p): p.numel() for m in modules if m is not None for p in m.parameters()}
    return sum(seen.values())


def greedy(steps: int, prompt: list[int], hops: list[tuple[ShardRunner, int, int]]) -> list[int]:
    caches = [runner.new_cache() for runner, _, _ in hops]
    tokens, step, position = [], list(prompt), 0
    for _ in range(steps):
        hidden = hops[0][0].embed(step)
        for (runner, start, end), cache in zip(hops, caches, strict=True):
            hidden = runner.run_layers(hidden, cache=cache, start=start, end=end, position=position)
        position += len(step)
        token = int(hops[-1][0].last_logits(hidden).argmax())
        tokens.append(token)
        step = [token]
    return tokens


def test_a_shard_holds_only_its_layers_and_the_modules_its_range_needs() -> None:
    head, tail, whole = shard(0, 1), shard(2, 3), shard(0, 3)
    assert sorted(head.layers) == [0, 1]
    assert head.embed is not None and head.lm_head is None and head.norm is None
    assert tail.embed is None and tail.lm_head is not None
    # The head tokenises prompts, the last hop follows grammars (ADR-0022); a middle does neither.
    assert head.tokenizer is not None and tail.tokenizer is not None
    assert shard(1, 2).tokenizer is None
    assert parameters(head) + parameters(tail) == parameters(whole)
    assert parameters(head) < 0.6 * parameters(whole)


def test_split_executors_generate_what_transformers_generates_whole() -> None:
    torch.set_num_threads(1)
    prompt = [257, 117, 115, 101, 114, 10, 104, 105, 258, 10, 257, 97]
    head, tail = ShardRunner(shard(0, 1)), ShardRunner(shard(2, 3))
    split = greedy(12, prompt, [(head, 0, 1), (tail, 2, 3)])

    model = LlamaForCausalLM(tiny_config())
    model.load_state_dict(tiny_state_dict())
    out = model.eval().generate(
        torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None
    )
    assert split == out[0, len(prompt) :].tolist()


def test_a_full_shard_can_run_from_a_later_layer() -> None:
    prompt = [257, 100, 101, 102, 258]
    partial, full = ShardRunner(shard(0, 2)), ShardRunner(shard(0, 3))
    mixed = greedy(8, prompt, [(partial, 0, 2), (full, 3, 3)])
    assert mixed == greedy(8, prompt, [(full, 0, 3)])


def test_decoding_with_the_cache_matches_recomputing_the_prefix() -> None:
    runner = ShardRunner(shard(0, 3))
    ids = [257, 40, 41, 42, 43, 44]
    cache = runner.new_cache()
    runner.run_layers(runner.embed(ids[:-1]), cache=cache, start=0, end=3, position=0)
    cached = runner.last_logits(
        runner.run_layers(runner.embed(ids[-1:]), cache=cache, start=0, end=3, position=5)
    )
    fresh = runner.last_logits(
        runner.run_layers(runner.embed(ids), cache=runner.new_cache(), start=0, end=3, position=0)
    )
    torch.testing.assert_close(cached, fresh, rtol=1e-4, atol=1e-5)


def test_layers_outside_the_model_are_refused() -> None:
    with pytest.raises(ModelSourceError, match="outside the model's layers 0-3"):
        shard(2, 4)


def test_an_unsupported_architecture_gets_a_clear_error(tmp_path) -> None:
    (tmp_path / "config.json").write_text(
        '{"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 50}'
    )
    with pytest.raises(UnsupportedModelError, match="'gpt2' is not served"):
        load_shard(
            model_key="gpt2-ish",
            source=ModelSource("directory", str(tmp_path)),
            start=0,
            end=1,
            progress=False,
        )


def test_an_unknown_model_key_without_weights_is_refused() -> None:
    with pytest.raises(ModelSourceError, match="no weights known"):
        resolve_source("no-such-model")
