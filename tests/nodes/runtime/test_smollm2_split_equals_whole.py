"""SmolLM2 (the real model) split across node processes over HTTP equals one full node."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.network import Network
from tests.support.nodes import SMOLLM2, generate_body, read_stream
from tests.support.sse import chunks_of, completion
from tracker_app.localnet import NodeProcess

pytestmark = pytest.mark.model

PROMPT = "What is the capital of France? Answer in one sentence."
NEW_TOKENS = 20


@pytest.fixture(scope="module")
def smol(smollm2_network: Network) -> dict[str, NodeProcess]:
    """head 0-14, tail 15-29, whole 0-29, partial head 0-21 (ADR-0020's topology), called
    directly (the session's SmolLM2 network, see tests/conftest.py)."""
    return smollm2_network.nodes


@pytest.fixture(scope="module")
def whole_output(smol: dict[str, NodeProcess]) -> tuple[str, list[int]]:
    whole = smol["whole"]
    body = generate_body([(whole, 0, 29)], model=SMOLLM2, content=PROMPT, max_tokens=NEW_TOKENS)
    text, ids, _ = completion(read_stream(whole.endpoint, body))
    return text, ids


def test_the_whole_model_answers_sensibly(whole_output: tuple[str, list[int]]) -> None:
    text, ids = whole_output
    assert "Paris" in text
    assert 1 <= len(ids) <= NEW_TOKENS


def test_split_0_14_and_15_29_equals_the_whole_model(
    smol: dict[str, NodeProcess], whole_output: tuple[str, list[int]]
) -> None:
    head, tail = smol["head"], smol["tail"]
    body = generate_body(
        [(head, 0, 14), (tail, 15, 29)], model=SMOLLM2, content=PROMPT, max_tokens=NEW_TOKENS
    )
    text, ids, _ = completion(read_stream(head.endpoint, body))
    assert (text, ids) == whole_output


def test_partial_head_then_full_node_from_layer_22_equals_the_whole_model(
    smol: dict[str, NodeProcess], whole_output: tuple[str, list[int]]
) -> None:
    # ADR-0020's topology: the full node must start at 22, not at its own shard start 0.
    partial, whole = smol["partial"], smol["whole"]
    body = generate_body(
        [(partial, 0, 21), (whole, 22, 29)], model=SMOLLM2, content=PROMPT, max_tokens=NEW_TOKENS
    )
    text, ids, _ = completion(read_stream(partial.endpoint, body))
    assert (text, ids) == whole_output


ECHOED = "The capital of France is Paris, and the capital of Italy is Rome."


def test_an_echo_on_the_split_route_reports_the_whole_models_prompt_logprobs(
    smol: dict[str, NodeProcess],
) -> None:
    # What evaluation harnesses score a split model by: one forward pass of the prompt.
    head, tail, whole = smol["head"], smol["tail"], smol["whole"]
    asked: dict[str, Any] = {
        "prompt": ECHOED,
        "max_tokens": 0,
        "echo": True,
        "logprobs": True,
        "top_logprobs": 2,
    }
    split = chunks_of(
        read_stream(
            head.endpoint, generate_body([(head, 0, 14), (tail, 15, 29)], model=SMOLLM2, **asked)
        )
    )[0]
    alone = chunks_of(
        read_stream(whole.endpoint, generate_body([(whole, 0, 29)], model=SMOLLM2, **asked))
    )[0]

    assert split["meshnet_prompt_token_ids"] == alone["meshnet_prompt_token_ids"]
    entries, expected = split["meshnet_prompt_logprobs"], alone["meshnet_prompt_logprobs"]
    assert len(entries) == len(split["meshnet_prompt_token_ids"]) > 10
    assert bytes(b for entry in entries for b in entry["bytes"]).decode() == ECHOED
    assert entries[0]["logprob"] is None and expected[0]["logprob"] is None
    for mine, theirs in zip(entries[1:], expected[1:], strict=True):
        assert mine["token"] == theirs["token"]
        assert [top["token"] for top in mine["top_logprobs"]] == [
            top["token"] for top in theirs["top_logprobs"]
        ]
        assert [
            mine["logprob"],
            *(top["logprob"] for top in mine["top_logprobs"]),
        ] == pytest.approx(
            [theirs["logprob"], *(top["logprob"] for top in theirs["top_logprobs"])], abs=1e-4
        )
    # "Paris" after "The capital of France is" is what the model expects.
    paris = next(i for i, entry in enumerate(entries) if entry["token"] == " Paris")
    assert entries[paris]["top_logprobs"][0]["token"] == " Paris"
