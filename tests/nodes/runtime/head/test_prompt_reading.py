"""The head reads a prompt before it runs it (``generation.prompt_for``): the tiny model."""

from __future__ import annotations

import asyncio

import pytest
import torch

from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.signed_plan import PlanHop
from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.trust import PlanGate
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.head.route_driver import prompt_for
from nodes_app.runtime.loading.shard import load_shard
from nodes_app.shared.sources import resolve_source

TINY = "tiny-random-llama"


def tiny_head() -> NodeService:
    torch.set_num_threads(1)
    shard = load_shard(model_key=TINY, source=resolve_source(TINY), start=0, end=3, progress=False)
    return NodeService(shard, node_id="head", kv_budget=2**26, gate=PlanGate(dev_open=True))


def raw_prompt(text: str) -> GenerateRequest:
    return GenerateRequest(
        request_id="req-1",
        model=TINY,
        hops=(PlanHop("head", "http://head:7000", 0, 3),),
        messages=[],
        prompt=text,
        max_tokens=4,
    )


def test_a_prompt_the_tokenizer_writes_with_an_id_past_the_vocabulary_is_refused() -> None:
    async def run() -> None:
        service = tiny_head()
        try:
            # A token the tokenizer knows and the model has no embedding for.
            tokenizer = service.shard.tokenizer
            assert tokenizer is not None
            tokenizer.add_tokens(["<|extra|>"])
            assert await prompt_for(service, raw_prompt("Hi")) == [72, 105]
            with pytest.raises(RuntimeRequestError) as caught:
                await prompt_for(service, raw_prompt("Hi <|extra|>"))
            assert (caught.value.status, caught.value.code) == (400, "invalid_request")
            assert "vocabulary" in caught.value.message
        finally:
            service.close()

    asyncio.run(run())
