"""A real instruct model through the tracker: SmolLM2 split over two node processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.databases import fresh_process_database
from tests.support.network import Network, head_generate, start_network
from tests.support.sse import chunks_of, text_of

pytestmark = pytest.mark.model

SMOLLM2 = "smollm2-135m"
PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    with fresh_process_database() as database_url:
        tmp: Path = tmp_path_factory.mktemp("smol-chat")
        for network in start_network(database_url, tmp):
            network.add_node("first", SMOLLM2, (0, 14), wait=False)
            network.add_node("second", SMOLLM2, (15, 29), wait=False)
            network.wait_for_nodes()
            yield network


def test_smollm2_streams_through_the_tracker_exactly_as_its_head_answers(smol: Network) -> None:
    frames = smol.stream(model=SMOLLM2, messages=PROMPT, max_tokens=16, temperature=0)

    first, second = smol.nodes["first"], smol.nodes["second"]
    direct = head_generate(
        smol,
        first,
        [first.hop(), second.hop()],
        model=SMOLLM2,
        messages=PROMPT,
        max_tokens=16,
        temperature=0.0,
    )
    assert text_of(frames) == direct
    assert "Paris" in direct
    assert chunks_of(frames)[0]["meshnet"]["route"].endswith(f"{second.node_id}[15-29]")
