"""Families whose runner needs more than plain layers, served by real node processes.

An operator's path: a checkpoint directory, ``manage.py add_model``, then
``runnode --weights DIR`` for a whole node and for a two-node split. Each
head's greedy answer must be transformers' own greedy ``generate`` on the
same checkpoint, token for token, whole and split; and a client's chat
through the tracker gets it too. The families: the hybrid Gated DeltaNet MoE
of the Qwen3.5/3.6 generation (its split falls between linear-attention and
full-attention layers), Gemma 4 (every hop is sent the step's token ids for
its per-layer inputs), GPT-OSS (eager attention with sinks) and Llama 4
(chunked attention; NoPE layers batched at one past).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nodes_app.shared.prompting import prompt_token_ids
from nodes_app.shared.tokenization import model_text_load
from tests.support.checkpoints import LAYERS, tiny_checkpoint, transformers_greedy
from tests.support.network import Network, start_network
from tests.support.nodes import generate_body, read_stream
from tests.support.sse import completion, text_of
from tracker_app.localnet import fresh_process_database, manage_argv, run_checked

pytestmark = pytest.mark.model

FAMILIES = ("qwen3_5_moe_text", "gemma4_text", "gpt_oss", "llama4_text")
QUESTION = "Which layer runs where?"
MESSAGES = [{"role": "user", "content": QUESTION}]
TOKENS = 10
EOS = 258  # the tiny tokenizer's end of text
SPLIT = 2  # head 0-2, tail 3-5: for the hybrid family, linear attention | full attention


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Network, dict[str, Path]]]:
    tmp = tmp_path_factory.mktemp("families-served")
    checkpoints = {family: tiny_checkpoint(family, tmp / family) for family in FAMILIES}
    with fresh_process_database() as database_url:
        for network in start_network(database_url, tmp / "network"):
            for family, directory in checkpoints.items():
                key = family.replace("_", "-")
                run_checked(
                    manage_argv("add_model", key, "--weights", str(directory)), env=network.env
                )
                weights = ("--weights", str(directory), "--dev-open")
                for name, layers in {
                    "whole": (0, LAYERS - 1),
                    "head": (0, SPLIT),
                    "tail": (SPLIT + 1, LAYERS - 1),
                }.items():
                    network.add_node(f"{key}-{name}", key, layers, extra=weights, wait=False)
            network.wait_for_nodes(timeout=240)
            yield network, checkpoints


def expected(directory: Path) -> list[int]:
    tokenizer = model_text_load(str(directory)).tokenizer
    tokens, _ = transformers_greedy(directory, prompt_token_ids(tokenizer, MESSAGES), TOKENS)
    return tokens


@pytest.mark.parametrize("family", FAMILIES)
def test_a_whole_node_and_a_split_answer_as_transformers_generates(
    served: tuple[Network, dict[str, Path]], family: str
) -> None:
    network, checkpoints = served
    key = family.replace("_", "-")
    nodes = network.nodes
    routes = {
        "whole": [(nodes[f"{key}-whole"], 0, LAYERS - 1)],
        "split": [(nodes[f"{key}-head"], 0, SPLIT), (nodes[f"{key}-tail"], SPLIT + 1, LAYERS - 1)],
    }
    reference = expected(checkpoints[family])

    for route in routes.values():
        body = generate_body(route, model=key, max_tokens=TOKENS, content=QUESTION)
        _, ids, _ = completion(read_stream(route[0][0].endpoint, body))
        # The node stops at the end-of-text token; transformers was told not to.
        ended = ids[-1:] == [EOS] or len(ids) == TOKENS
        assert (ids, ended) == (reference[: len(ids)], True)


def test_a_client_chat_through_the_tracker_gets_the_split_models_answer(
    served: tuple[Network, dict[str, Path]],
) -> None:
    network, _ = served
    key = "qwen3-5-moe-text"
    head, tail = network.nodes[f"{key}-head"], network.nodes[f"{key}-tail"]
    body = generate_body([(head, 0, SPLIT), (tail, SPLIT + 1, LAYERS - 1)], model=key,
                         max_tokens=TOKENS, content=QUESTION)  # fmt: skip
    direct = text_of(read_stream(head.endpoint, body))

    response = network.chat(
        model=key,
        messages=MESSAGES,
        max_tokens=TOKENS,
        temperature=0,
        route=[head.node_id, tail.node_id],
    )

    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == direct
