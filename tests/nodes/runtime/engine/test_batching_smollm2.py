"""SmolLM2 (the real model) on one in-process node: sessions decoded in a batch equal them alone.

Few and short: three prompts of different lengths, a handful of tokens, one
of them joining after the others have started.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.sampler import SamplingParams, TailRequest
from nodes_app.runtime.engine.trust import PlanGate
from nodes_app.runtime.loading.shard import load_shard
from nodes_app.runtime.wire.entries import Choice
from nodes_app.shared.sources import resolve_source
from tests.support.nodes import SMOLLM2

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, seed=0)
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def service() -> NodeService:
    torch.set_num_threads(1)
    shard = load_shard(
        model_key=SMOLLM2, source=resolve_source(SMOLLM2), start=0, end=29, progress=False
    )
    return NodeService(shard, node_id="smol", gate=PlanGate(dev_open=True), kv_budget=2**30)


@pytest.fixture(scope="module")
def prompts(service: NodeService) -> list[list[int]]:
    tokenizer = service.shard.tokenizer
    assert tokenizer is not None
    texts = [
        "The capital of France is",
        "Water boils at a temperature of one hundred degrees",
        "Once upon a time",
    ]
    return [list(tokenizer.encode(text)) for text in texts]


async def decode(
    service: NodeService, name: str, prompt: list[int], started: asyncio.Event | None = None
) -> list[int]:
    session = service.admission.open_session(name, 0, 29)
    tokens, ids = [], prompt
    try:
        for _ in range(NEW_TOKENS):
            async with session.lock:
                choice = await service.head_forward(session, ids, TailRequest(GREEDY))
                session.position += len(ids)
            assert isinstance(choice, Choice)
            tokens.append(choice.token_id)
            ids = [choice.token_id]
            if started is not None and len(tokens) == 2:
                started.set()
    finally:
        service.cancel(name)
    return tokens


def test_smollm2_sessions_batched_and_joining_mid_batch_decode_what_they_decode_alone(
    service: NodeService, prompts: list[list[int]]
) -> None:
    async def run() -> tuple[list[list[int]], list[list[int]]]:
        alone = [await decode(service, f"alone{i}", p) for i, p in enumerate(prompts)]
        started = asyncio.Event()

        async def late() -> list[int]:
            await started.wait()
            return await decode(service, "late", prompts[2])

        batched = await asyncio.gather(
            decode(service, "a", prompts[0], started), decode(service, "b", prompts[1]), late()
        )
        return alone, list(batched)

    alone, batched = asyncio.run(run())
    assert batched == alone
    assert max(service.scheduler.batch_sizes) >= 2
