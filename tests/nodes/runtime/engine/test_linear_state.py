"""Linear-attention states through the batch cache, against transformers' own forward.

The hybrid families (Gated DeltaNet layers between full-attention layers) are
driven layer by layer with :class:`BatchCache` the way the runner drives a
range: explicit positions per row, no mask for a linear-attention layer, the
boolean causal mask for a full-attention one, ``commit()`` after the layers.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import cast

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationMixin, PreTrainedModel

from nodes_app.runtime.engine.family_adapters import LINEAR_ATTENTION, family_of
from nodes_app.runtime.engine.kv import (
    MIN_CAPACITY,
    BatchCache,
    SessionKV,
    attention_mask,
    bytes_per_position,
    linear_state_bytes,
    session_bytes,
)
from tests.support.checkpoints import LAYERS, SEED, tiny_family_config

HYBRID_FAMILIES = ["qwen3_next", "qwen3_5_moe_text"]


@pytest.fixture(scope="module", params=HYBRID_FAMILIES)
def model(request: pytest.FixtureRequest) -> Iterator[PreTrainedModel]:
    """The family's tiny model, seeded and widened as ``tiny_checkpoint`` makes it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    config = tiny_family_config(request.param)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        built = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation="sdpa"
        )
        for parameter in built.parameters():
            parameter.data.normal_(0.0, 0.2)
    yield built.eval()
    torch.set_num_threads(threads)


def prompt(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (length,), generator=generator).tolist()


@torch.inference_mode()
def step(
    model: PreTrainedModel, sessions: Sequence[SessionKV], ids: list[list[int]], pasts: list[int]
) -> torch.Tensor:
    """Logits ``[N, q, vocab]`` after layers 0..5; row ``i`` continues ``sessions[i]``."""
    inner = model.model
    length = len(ids[0])
    hidden = inner.embed_tokens(torch.tensor(ids))
    position_ids = torch.tensor(pasts).unsqueeze(1) + torch.arange(length)
    position_embeddings = inner.rotary_emb(hidden, position_ids)
    full_mask = attention_mask(pasts, length, window=None, device=hidden.device)
    cache = BatchCache(sessions)
    for index in range(LAYERS):
        linear = model.config.layer_types[index] == LINEAR_ATTENTION
        hidden = inner.layers[index](
            hidden,
            attention_mask=None if linear else full_mask,
            position_embeddings=position_embeddings,
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
        )
    cache.commit()
    return model.lm_head(inner.norm(hidden))


def linear_layers(model: PreTrainedModel) -> list[int]:
    return [i for i, kind in enumerate(model.config.layer_types) if kind == LINEAR_ATTENTION]


def assert_same_states(
    model: PreTrainedModel, got: SessionKV, expected: SessionKV, *, atol: float
) -> None:
    for layer in linear_layers(model):
        for ours, theirs in (
            (got.conv_state(layer), expected.conv_state(layer)),
            (got.recurrent_state(layer), expected.recurrent_state(layer)),
        ):
            assert ours is not None and theirs is not None
            torch.testing.assert_close(ours, theirs, atol=atol, rtol=1e-5)


def test_prefill_and_decode_through_the_layers_match_transformers_forward_and_generate(
    model: PreTrainedModel,
) -> None:
    ids, tokens = prompt(7, seed=1), 8
    session = SessionKV()
    logits = [step(model, [session], [ids], [0])[0]]
    generated = [int(logits[-1][-1].argmax())]
    for _ in range(tokens - 1):
        position = len(ids) + len(generated) - 1
        logits.append(step(model, [session], [[generated[-1]]], [position])[0])
        generated.append(int(logits[-1][-1].argmax()))

    with torch.inference_mode():
        whole = torch.tensor([ids + generated])
        reference = model(whole).logits[0, :-1]
        greedy = cast(GenerationMixin, model).generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
        )
    torch.testing.assert_close(torch.cat(logits), reference, atol=1e-4, rtol=0)
    assert generated == greedy[0, len(ids) :].tolist()


def test_a_prefill_in_chunks_continues_the_state_of_one_prefill(model: PreTrainedModel) -> None:
    ids = prompt(12, seed=2)
    whole, chunked = SessionKV(), SessionKV()
    expected = step(model, [whole], [ids], [0])[0]
    got = torch.cat(
        [
            step(model, [chunked], [ids[start:end]], [start])[0]
            for start, end in ((0, 5), (5, 8), (8, 12))
        ]
    )

    # The delta rule sums in another order per chunk: logits agree to 1e-4
    # (as with transformers' own forward), the states to 1e-5.
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    assert_same_states(model, chunked, whole, atol=1e-5)
    # The next decode step reads the kept states (the convolution's in place).
    torch.testing.assert_close(
        step(model, [chunked], [[7]], [12]), step(model, [whole], [[7]], [12]), atol=1e-4, rtol=0
    )


def test_sessions_decoded_as_one_batch_match_each_decoded_alone(model: PreTrainedModel) -> None:
    lengths = [3, 6, 11]
    sessions = [SessionKV() for _ in lengths]
    for index, (session, length) in enumerate(zip(sessions, lengths, strict=True)):
        step(model, [session], [prompt(length, seed=10 + index)], [0])
    alone = copy.deepcopy(sessions)

    pasts, tokens = list(lengths), [[5], [17], [40]]
    for _ in range(2):
        batched = step(model, sessions, tokens, pasts)
        for row, session in enumerate(alone):
            single = step(model, [session], [tokens[row]], [pasts[row]])
            # Logits reach ~6: a batch's other matmul shapes round differently.
            torch.testing.assert_close(batched[row], single[0], atol=1e-5, rtol=1e-5)
        # A second step shows the written-back states are the ones each session continues from.
        tokens = [[int(batched[row, -1].argmax())] for row in range(len(lengths))]
        pasts = [past + 1 for past in pasts]

    for batched_session, alone_session in zip(sessions, alone, strict=True):
        assert_same_states(model, batched_session, alone_session, atol=1e-5)


def test_a_sessions_first_step_batched_with_others_decode_steps_starts_from_empty_states(
    model: PreTrainedModel,
) -> None:
    started, fresh = SessionKV(), SessionKV()
    step(model, [started], [prompt(4, seed=3)], [0])
    alone_started, alone_fresh = copy.deepcopy(started), SessionKV()

    batched = step(model, [started, fresh], [[9], [11]], [4, 0])

    torch.testing.assert_close(
        batched[0], step(model, [alone_started], [[9]], [4])[0], atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(
        batched[1], step(model, [alone_fresh], [[11]], [0])[0], atol=1e-5, rtol=1e-5
    )
    assert_same_states(model, fresh, alone_fresh, atol=1e-5)


def test_a_session_counts_its_fixed_linear_states_as_admission_does(
    model: PreTrainedModel,
) -> None:
    session = SessionKV(limit=MIN_CAPACITY)
    step(model, [session], [prompt(5, seed=4)], [0])
    family = family_of(model.config)
    shard = SimpleNamespace(
        config=model.config,
        dtype=torch.float32,
        family=family,
        layer_types=[family.layer_type(model.config, i) for i in range(LAYERS)],
    )
    kv_bytes = MIN_CAPACITY * bytes_per_position(shard, 0, LAYERS - 1)

    # One full-attention layer of 2 KV heads × 16 keeps K/V; five linear layers
    # keep a conv state (128 channels × 4) and a recurrent state (4 × 16 × 16).
    assert bytes_per_position(shard, 0, LAYERS - 1) == 2 * 2 * 16 * 4
    assert linear_state_bytes(shard, 0, LAYERS - 1) == 5 * (128 * 4 * 4 + 4 * 16 * 16 * 4)
    assert linear_state_bytes(shard, 3, 3) == 0
    assert session.nbytes == kv_bytes + linear_state_bytes(shard, 0, LAYERS - 1)
    assert session_bytes(shard, 0, LAYERS - 1, MIN_CAPACITY) == session.nbytes
