"""A real instruct model through the tracker: SmolLM2 split over two node processes."""

from __future__ import annotations

import pytest

from tests.support.network import Network, head_generate
from tests.support.nodes import SMOLLM2
from tests.support.sse import chunks_of, text_of

pytestmark = pytest.mark.model

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


def test_smollm2_streams_through_the_tracker_exactly_as_its_head_answers(
    smollm2_network: Network,
) -> None:
    # The session's network (tests/conftest.py) has several routes; this chat pins the split one.
    smol = smollm2_network
    head, tail = smol.nodes["head"], smol.nodes["tail"]
    frames = smol.stream(
        model=SMOLLM2,
        messages=PROMPT,
        max_tokens=16,
        temperature=0,
        route=[head.node_id, tail.node_id],
    )

    direct = head_generate(
        smol,
        head,
        [head.hop(), tail.hop()],
        model=SMOLLM2,
        messages=PROMPT,
        max_tokens=16,
        temperature=0.0,
    )
    assert text_of(frames) == direct
    assert "Paris" in direct
    assert chunks_of(frames)[0]["meshnet"]["route"].endswith(f"{tail.node_id}[15-29]")
