"""A shard's precision (``--dtype``, ``--quantize``) on the tiny model, in process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from django.core.management import CommandError, call_command
from starlette.testclient import TestClient
from transformers import AutoModelForCausalLM

from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.runner import ShardRunner
from nodes_app.runtime.engine.trust import PlanGate
from nodes_app.runtime.loading.shard import LoadedShard, load_shard
from nodes_app.runtime.server import create_app
from nodes_app.runtime.wire.tensors import tensor_to_bytes
from nodes_app.shared.model_errors import UnsupportedModelError
from nodes_app.shared.sources import resolve_source
from nodes_app.shared.tokenization import tiny_tokenizer
from tests.support.checkpoints import LAYERS, tiny_family_config
from tests.support.link import in_process_link, tiny_step

TINY = "tiny-random-llama"
PROMPT = [1, 15, 27, 3, 99, 42]


def tiny_shard(
    start: int = 0, end: int = 3, *, dtype: str = "auto", quantize: str = "none"
) -> LoadedShard:
    torch.set_num_threads(1)
    return load_shard(
        model_key=TINY,
        source=resolve_source(TINY),
        start=start,
        end=end,
        dtype=dtype,
        quantize=quantize,
        progress=False,
    )


def stored_dtype(module: Any) -> torch.dtype:
    """What a module's weight is stored as: a torchao int8 weight keeps its bytes in ``qdata``."""
    weight = module.weight
    return weight.qdata.dtype if hasattr(weight, "qdata") else weight.dtype


def logits_of(shard: LoadedShard, ids: list[int]) -> torch.Tensor:
    runner = ShardRunner(shard)
    hidden = runner.run_layers(
        runner.embed(ids), cache=runner.new_cache(), start=0, end=3, position=0
    )
    return runner.logits(hidden)[0]


def greedy(shard: LoadedShard, ids: list[int], count: int) -> list[int]:
    runner = ShardRunner(shard)
    cache = runner.new_cache()
    hidden = runner.run_layers(runner.embed(ids), cache=cache, start=0, end=3, position=0)
    tokens = [int(runner.last_logits(hidden).argmax())]
    for position in range(len(ids), len(ids) + count - 1):
        hidden = runner.run_layers(
            runner.embed(tokens[-1:]), cache=cache, start=0, end=3, position=position
        )
        tokens.append(int(runner.last_logits(hidden).argmax()))
    return tokens


def test_auto_computes_in_float32_on_cpu() -> None:
    shard = tiny_shard()

    assert shard.dtype == torch.float32
    assert shard.precision == "float32"


def test_a_bfloat16_shard_computes_in_bfloat16_and_generates() -> None:
    shard = tiny_shard(dtype="bfloat16")

    assert all(
        p.dtype == torch.bfloat16 for layer in shard.layers.values() for p in layer.parameters()
    )
    runner = ShardRunner(shard)
    hidden = runner.run_layers(
        runner.embed(PROMPT), cache=runner.new_cache(), start=0, end=3, position=0
    )
    assert hidden.dtype == torch.bfloat16
    tokens = greedy(shard, PROMPT, 8)
    assert len(tokens) == 8
    assert all(0 <= token < shard.config.vocab_size for token in tokens)


def test_an_int8_shard_stays_close_to_float32() -> None:
    reference = logits_of(tiny_shard(), PROMPT)
    quantised_shard = tiny_shard(quantize="int8")
    quantised = logits_of(quantised_shard, PROMPT)

    assert quantised_shard.precision == "float32+int8"
    error = (quantised - reference).norm() / reference.norm()
    assert error < 0.05, error
    assert torch.equal(quantised.argmax(-1), reference.argmax(-1))


def test_an_int8_shard_holds_its_linear_weights_and_embeddings_in_int8() -> None:
    shard = tiny_shard(quantize="int8")

    layer: Any = shard.layers[0]
    assert stored_dtype(layer.self_attn.q_proj) == torch.int8
    assert stored_dtype(layer.mlp.down_proj) == torch.int8
    assert shard.embed is not None and shard.embed.rows.dtype == torch.int8
    assert stored_dtype(shard.lm_head) == torch.int8


def test_an_int8_tail_holds_its_lm_head_in_int8() -> None:
    shard = tiny_shard(2, 3, quantize="int8")

    assert shard.embed is None
    assert stored_dtype(shard.lm_head) == torch.int8


@pytest.fixture(scope="module")
def tied_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded tiny llama whose LM head is its embedding table, as SmolLM2's is."""
    config = tiny_family_config("llama")
    config.tie_word_embeddings = True
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        for parameter in model.parameters():
            parameter.data.normal_(0.0, 0.2)
    directory = tmp_path_factory.mktemp("tied")
    model.save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


def tied_shard(directory: Path, start: int, end: int, quantize: str) -> LoadedShard:
    return load_shard(
        model_key="tied",
        source=resolve_source("tied", str(directory)),
        start=start,
        end=end,
        quantize=quantize,
        progress=False,
    )


def test_a_tied_model_quantised_keeps_one_int8_table_for_embedding_and_lm_head(
    tied_checkpoint: Path,
) -> None:
    last = LAYERS - 1
    reference = tied_shard(tied_checkpoint, 0, last, "none")
    whole = tied_shard(tied_checkpoint, 0, last, "int8")
    tail = tied_shard(tied_checkpoint, 2, last, "int8")

    head_weight: Any = whole.lm_head.weight if whole.lm_head is not None else None
    assert whole.embed is not None and whole.embed.rows is head_weight.qdata
    assert tail.embed is None and stored_dtype(tail.lm_head) == torch.int8
    ids = [3, 14, 15, 92]
    expected = ShardRunner(reference).embed(ids)
    embedded = ShardRunner(whole).embed(ids)
    assert ((embedded - expected).norm() / expected.norm()) < 0.01


def test_an_int4_shard_packs_its_layers_weights_in_4_bits_close_to_float32() -> None:
    reference = tiny_shard()
    shard = tiny_shard(quantize="int4")
    from bitsandbytes.functional import dequantize_4bit  # imported quietly by the loader

    assert shard.precision == "float32+int4"
    q_proj: Any = shard.layers[0].self_attn.q_proj  # type: ignore[union-attr]
    # Two 4-bit values a byte, in bitsandbytes' packed column.
    assert q_proj.weight.dtype == torch.uint8
    assert q_proj.weight.numel() * 2 == q_proj.in_features * q_proj.out_features
    assert stored_dtype(shard.lm_head) == torch.int8
    original: Any = reference.layers[0].get_submodule("self_attn.q_proj").weight
    unpacked = dequantize_4bit(q_proj.weight.data, q_proj.weight.quant_state)
    assert (unpacked - original).norm() / original.norm() < 0.12
    # NF4's ~9 % per weight compounds over the tiny model's random layers.
    logits, expected = logits_of(shard, PROMPT), logits_of(reference, PROMPT)
    assert (logits - expected).norm() / expected.norm() < 0.5


def test_an_unknown_quantisation_is_refused_naming_the_choices() -> None:
    with pytest.raises(UnsupportedModelError, match="one of none, int8, int4"):
        tiny_shard(quantize="int3")


def test_the_ready_line_names_the_precision() -> None:
    assert " on cpu bfloat16+int8 in " in tiny_shard(dtype="bfloat16", quantize="int8").summary()
    assert " on cpu float32 in " in tiny_shard(2, 3).summary()


@pytest.fixture(scope="module")
def float32_tail() -> Iterator[TestClient]:
    """A float32 tail (layers 2-3) served in process, dev-open."""
    service = NodeService(tiny_shard(2, 3), node_id="tail", gate=PlanGate(dev_open=True))
    with TestClient(create_app(service, max_frame_bytes=2**20)) as client:
        yield client


def test_a_float32_tail_takes_a_bfloat16_heads_hidden_states_converting_them_once(
    float32_tail: TestClient,
) -> None:
    head = ShardRunner(tiny_shard(0, 1, dtype="bfloat16"))
    sent = head.run_layers(head.embed(PROMPT), cache=head.new_cache(), start=0, end=1, position=0)
    assert sent.dtype == torch.bfloat16
    tail = ShardRunner(tiny_shard(2, 3))
    local = tail.run_layers(
        sent.to(torch.float32), cache=tail.new_cache(), start=2, end=3, position=0
    )
    expected = int(tail.last_logits(local).argmax())

    with in_process_link(float32_tail) as link:
        step = tiny_step("mixed", len(PROMPT), dtype="bfloat16")
        answer = link.step(step, tensor_to_bytes(sent))
        link.cancel("mixed")

    assert answer.status == 200
    assert answer.token_id == expected


@pytest.mark.parametrize(
    ("flag", "value"), [("--dtype", "float8"), ("--dtype", "fp16"), ("--quantize", "int3")]
)
def test_runnode_refuses_a_precision_it_does_not_offer_naming_the_choices(
    flag: str, value: str
) -> None:
    with pytest.raises(CommandError, match="invalid choice") as caught:
        call_command(
            "runnode", "--model", TINY, "--layers", "0-3", "--port", "7001",
            "--tracker", "http://127.0.0.1:8000", flag, value,
        )  # fmt: skip
    assert value in str(caught.value) and "choose from" in str(caught.value)
