"""A draft round cut back at any position leaves a session as if only the kept positions ran.

Speculative decoding (ADR-0028) runs a round of the last token and its drafts
as one step, then the next step's position drops the rejected ones
(``NodeService.rewind``). For every state kind a family keeps — K/V over the
whole past, sliding windows (Mistral), per-layer inputs (Gemma 4), MLA's
latent (DeepSeek V3) and linear-attention convolution and recurrent states
(the hybrid families) — and on a head (token ids) as on a hop (hidden states),
a round cut back after each of its positions must leave the state a session
decoding those positions one at a time holds: the next step's logits within
1e-5, the linear states too.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from nodes_app.protocol.sampling import SamplingParams
from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.family_adapters import LINEAR_ATTENTION
from nodes_app.runtime.engine.kv import SessionKV
from nodes_app.runtime.engine.sampler import TailRequest
from nodes_app.runtime.engine.sessions import Session
from nodes_app.runtime.engine.trust import PlanGate
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.hop import step_intake
from nodes_app.runtime.loading.shard import load_shard
from nodes_app.runtime.wire.entries import Choice, ForwardStep
from nodes_app.runtime.wire.tensors import tensor_to_bytes
from nodes_app.shared.sources import ModelSource
from tests.support.checkpoints import LAYERS, tiny_checkpoint

GREEDY = SamplingParams(temperature=0.0)
PROMPT = [257, *range(60, 75), 258, 10]
# The round: the last accepted token, then four drafts.
ROUND = [97, 98, 99, 100, 101]
NEXT = 102
# Every state kind: K/V, a sliding window, per-layer inputs, MLA, linear attention.
FAMILIES = ["llama", "mistral", "gemma4_text", "deepseek_v3", "qwen3_next", "qwen3_5_moe_text"]


def service_of(directory: Path, start: int) -> NodeService:
    torch.set_num_threads(1)
    source = ModelSource("directory", str(directory))
    shard = load_shard(model_key="tiny", source=source, start=start, end=LAYERS - 1, progress=False)
    return NodeService(shard, node_id="node", gate=PlanGate(dev_open=True), kv_budget=2**28)


class Stepper:
    """Steps one session of ``service``: a head's token ids, or a hop's hidden states."""

    def __init__(self, service: NodeService, name: str) -> None:
        self.service = service
        self.name = name
        self.head = service.shard.start == 0
        self.session: Session | None = None
        if self.head:
            self.session = service.admission.open_session(name, 0, LAYERS - 1, reserve=64)

    def hidden(self, ids: list[int]) -> torch.Tensor:
        """A hop's input for ``ids``: the same values for the same ids wherever they run."""
        rows = []
        for token in ids:
            generator = torch.Generator().manual_seed(token)
            rows.append(torch.randn(1, 1, self.service.shard.hidden_size, generator=generator))
        return torch.cat(rows, dim=1)

    async def step(self, ids: list[int], drafts: list[int] | None = None) -> None:
        service, tokens = self.service, [*ids, *(drafts or [])]
        if self.head:
            session = self.session
            assert session is not None
            async with session.lock:
                tail = TailRequest(GREEDY, drafts=tuple(drafts or ()))
                result = await service.head_forward(session, tokens, tail)
                session.position += len(tokens)
            assert isinstance(result, Choice)
            return
        position = 0 if self.session is None else self.session.position
        step = ForwardStep(
            session_id=self.name,
            start=service.shard.start,
            end=LAYERS - 1,
            position=position,
            dtype="float32",
            shape=(1, len(tokens), service.shard.hidden_size),
            sampling=GREEDY if position == 0 else None,
            reserve=64 if position == 0 else None,
            token_ids=tuple(tokens) if service.shard.family.per_layer_inputs else None,
            drafts=tuple(drafts) if drafts else None,
        )
        await step_intake.forward(service, step, tensor_to_bytes(self.hidden(tokens)))
        self.session = service.store.get(self.name)

    async def cut(self, position: int) -> None:
        """What the next step's position does: the head rewinds itself, a hop on arrival."""
        session = self.session
        assert session is not None
        async with session.lock:
            await self.service.rewind(session, position)

    def logits_after(self, token: int) -> torch.Tensor:
        """The next position's logits for ``token`` (run outside the session's bookkeeping)."""
        session = self.session
        assert session is not None
        runner = self.service.runner
        hidden = runner.embed([token]) if self.head else self.hidden([token])
        out = runner.run_layers(
            hidden,
            cache=session.cache,
            start=self.service.shard.start,
            end=LAYERS - 1,
            position=session.position,
            token_ids=[token],
        )
        return runner.last_logits(out)[0]


def linear_states(service: NodeService, kv: SessionKV) -> list[torch.Tensor]:
    layers = range(service.shard.start, LAYERS)
    linear = [i for i in layers if service.shard.layer_types[i] == LINEAR_ATTENTION]
    states = [kv.conv_state(i) for i in linear] + [kv.recurrent_state(i) for i in linear]
    return [state for state in states if state is not None]


@pytest.mark.parametrize("side", ["head", "hop"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_round_cut_back_after_any_position_holds_what_plain_decoding_holds(
    checkpoints: dict[str, Path], family: str, side: str
) -> None:
    directory = checkpoints[family]
    if not directory.exists():
        tiny_checkpoint(family, directory)
    service = service_of(directory, 0 if side == "head" else 1)

    async def run() -> None:
        for kept in range(len(ROUND) + 1):
            spec = Stepper(service, f"spec-{kept}")
            plain = Stepper(service, f"plain-{kept}")
            await spec.step(PROMPT)
            await plain.step(PROMPT)
            await spec.step(ROUND[:1], ROUND[1:])
            await spec.cut(len(PROMPT) + kept)
            for token in ROUND[:kept]:
                await plain.step([token])

            assert spec.session is not None and plain.session is not None
            assert spec.session.position == plain.session.position
            torch.testing.assert_close(
                spec.logits_after(NEXT), plain.logits_after(NEXT), rtol=0, atol=1e-4
            )
            for ours, theirs in zip(
                linear_states(service, spec.session.cache),
                linear_states(service, plain.session.cache),
                strict=True,
            ):
                torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
            service.cancel(spec.name)
            service.cancel(plain.name)

    try:
        asyncio.run(run())
    finally:
        service.close()


def test_a_hop_refuses_a_position_outside_the_round_it_ran(checkpoints: dict[str, Path]) -> None:
    directory = checkpoints["qwen3_next"]
    if not directory.exists():
        tiny_checkpoint("qwen3_next", directory)
    service = service_of(directory, 1)

    async def run() -> None:
        hop = Stepper(service, "hop")
        await hop.step(PROMPT)
        # Before the round's start, and one past its end.
        for offset in (-1, len(ROUND) + 1):
            await hop.step(ROUND[:1], ROUND[1:])
            assert hop.session is not None
            start = hop.session.position - len(ROUND)
            with pytest.raises(RuntimeRequestError) as refused:
                await hop.cut(start + offset)
            assert refused.value.code == "position_mismatch"

    try:
        asyncio.run(run())
    finally:
        service.close()


def test_a_held_round_start_is_the_one_extra_position_a_linear_state_resumes_at() -> None:
    kv = SessionKV()
    kv.keep_conv_state(0, torch.ones(1, 2, 4))
    kv.keep_recurrent_state(0, torch.ones(1, 1, 2, 2))
    kv.ran(10, prefill=True)
    base = kv.nbytes

    kv.hold()
    kv.keep_conv_state(0, torch.zeros(1, 2, 4))
    kv.ran(15, prefill=False)

    assert kv.resumable(10) and not kv.resumable(12)
    assert kv.nbytes == 2 * base  # the held copy is counted while the round runs
    kv.truncate(10)
    restored = kv.conv_state(0)
    assert restored is not None and torch.equal(restored, torch.ones(1, 2, 4))
    assert kv.nbytes == base and not kv.resumable(5)
