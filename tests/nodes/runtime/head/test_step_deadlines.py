"""A node's step deadlines: a long prefill gets one step timeout per block of positions, a
step timeout out of range is refused before anything is loaded, and a head streams
something after every step (the tracker's silence limit is per step).
"""

from __future__ import annotations

import argparse

import pytest
import torch
from django.core.management import CommandError, call_command
from starlette.testclient import TestClient

from nodes_app.protocol.limits import STEP_TIMEOUT_POSITIONS, step_time_limit
from nodes_app.runtime.__main__ import step_timeout_argument
from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.trust import PlanGate
from nodes_app.runtime.loading.shard import load_shard
from nodes_app.runtime.server import create_app
from nodes_app.shared.sources import resolve_source
from tests.support.sse import chunks_of, sse_frames, text_of

TINY = "tiny-random-llama"
PROMPT = [{"role": "user", "content": "Tell me about meshes."}]


def test_a_long_prefill_gets_one_step_timeout_per_block_of_positions() -> None:
    assert step_time_limit(30.0, 1) == 30.0
    assert step_time_limit(30.0, STEP_TIMEOUT_POSITIONS) == 30.0
    assert step_time_limit(30.0, STEP_TIMEOUT_POSITIONS + 1) == 60.0
    assert step_time_limit(30.0, 4 * STEP_TIMEOUT_POSITIONS) == 120.0


def test_runnode_refuses_a_step_timeout_out_of_range_before_loading_anything() -> None:
    with pytest.raises(CommandError, match="--step-timeout"):
        call_command(
            "runnode", "--model", TINY, "--layers", "0-3", "--port", "1",
            "--tracker", "http://127.0.0.1:9", "--step-timeout", "0",
        )  # fmt: skip


@pytest.mark.parametrize("value", ["0", "-1", "601", "soon"])
def test_a_node_process_refuses_a_step_timeout_out_of_range(value: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        step_timeout_argument(value)


def test_a_head_streams_something_after_every_step_even_when_it_holds_the_text_back() -> None:
    # The tracker's silence limit is per step: a step whose text is held back (here by a
    # stop sequence the answer starts but never completes) still sends an SSE comment.
    torch.set_num_threads(1)
    shard = load_shard(model_key=TINY, source=resolve_source(TINY), start=0, end=3, progress=False)
    service = NodeService(shard, node_id="whole", gate=PlanGate(dev_open=True))
    hop = {"node_id": "whole", "endpoint": "http://testserver", "start_layer": 0, "end_layer": 3}
    body = {"request_id": "held", "messages": PROMPT, "max_tokens": 12, "temperature": 0.0,
            "plan": {"model": TINY, "hops": [hop]}}  # fmt: skip
    with TestClient(create_app(service)) as head:
        plain = text_of(sse_frames(head.post("/v1/generate", json=body).text.splitlines()))
        held = head.post("/v1/generate", json={**body, "stop": [plain[3:7] + "\u0001"]})

    lines = held.text.splitlines()
    frames = sse_frames(lines)
    comments = [line for line in lines if line.startswith(":")]
    stepped = [f for f in chunks_of(frames) if f.get("meshnet_token_ids")]
    assert text_of(frames) == plain
    assert len(comments) == 4  # the four characters held until the stop could not match
    assert len(stepped) + len(comments) == 12  # one frame or one comment per step
