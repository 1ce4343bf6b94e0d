"""A grammar on real nodes: the last hop follows it, batched, split and resumed alike.

Tiny-model node processes called straight at the head's ``/v1/generate``: a
split route (head 0-1, tail 2-3, so the tail follows the grammar the head
forwards) and a one-node route (0-3). The tiny model's weights are random, so
whatever it writes inside the grammar is the mask's doing, not the model's
manners. The grammar is the one the tracker compiles from a ``response_format``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from tests.support.nodes import (
    TINY,
    generate_body,
    one_node_frames,
    running_nodes,
    split_frames,
)
from tests.support.sse import completion
from tracker_app.completions.structured import response_format_grammar
from tracker_app.localnet import NodeProcess

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
POINT = {
    "type": "object",
    "properties": {"x": {"type": "number"}, "y": {"type": "boolean"}},
    "required": ["x", "y"],
    "additionalProperties": False,
}


def grammar(schema: dict[str, Any]) -> str:
    compiled = response_format_grammar(
        {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    )
    assert compiled is not None
    return compiled


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, NodeProcess]]:
    tmp: Path = tmp_path_factory.mktemp("grammar")
    layouts = {"head": (0, 1), "tail": (2, 3), "whole": (0, 3)}
    with running_nodes(tmp, TINY, layouts, prefix="grammar", timeout=120) as started:
        yield started


def sampled(schema: dict[str, Any], seed: int) -> dict[str, Any]:
    return {"grammar": grammar(schema), "temperature": 1.0, "seed": seed, "max_tokens": 200}


def test_every_sampled_answer_is_valid_for_its_schema_and_the_split_route_answers_as_one_node(
    nodes: dict[str, NodeProcess],
) -> None:
    for seed in range(4):
        text, _, last = completion(split_frames(nodes, **sampled(PERSON, seed)))
        whole_text, _, _ = completion(one_node_frames(nodes, **sampled(PERSON, seed)))

        jsonschema.validate(json.loads(text), PERSON)
        assert last["choices"][0]["finish_reason"] == "stop"
        assert whole_text == text


def test_without_the_grammar_the_same_draws_are_not_json(nodes: dict[str, NodeProcess]) -> None:
    asked = sampled(PERSON, 0)
    del asked["grammar"]
    text, _, _ = completion(split_frames(nodes, **asked))

    with pytest.raises(ValueError):
        json.loads(text)


def test_batched_sessions_each_follow_their_own_grammar(nodes: dict[str, NodeProcess]) -> None:
    schemas = [PERSON, POINT] * 3
    with ThreadPoolExecutor(len(schemas)) as pool:
        answers = list(
            pool.map(
                lambda job: completion(split_frames(nodes, **sampled(job[1], job[0])))[0],
                enumerate(schemas),
            )
        )

    for text, schema in zip(answers, schemas, strict=True):
        jsonschema.validate(json.loads(text), schema)


def test_a_resumed_completion_continues_the_grammar_where_it_was_cut(
    nodes: dict[str, NodeProcess],
) -> None:
    """What a failover replays: the new route's last hop resumes the grammar's state
    (greedy, so the uninterrupted answer is what the resumed one must continue)."""
    greedy = {**sampled(PERSON, 0), "temperature": 0.0}
    text, ids, _ = completion(split_frames(nodes, **greedy))

    resumed = split_frames(nodes, **greedy, resume_token_ids=ids[:9])

    assert completion(resumed)[1] == ids[9:]
    jsonschema.validate(json.loads(text), PERSON)


def test_an_answer_cut_by_max_tokens_says_length(nodes: dict[str, NodeProcess]) -> None:
    text, ids, last = completion(split_frames(nodes, **{**sampled(PERSON, 1), "max_tokens": 5}))

    assert len(ids) == 5
    assert last["choices"][0]["finish_reason"] == "length"
    assert text.startswith("{")


def test_a_grammar_the_tokenizer_cannot_follow_is_the_heads_400_before_any_hop(
    nodes: dict[str, NodeProcess],
) -> None:
    head, tail = nodes["head"], nodes["tail"]
    body = generate_body(
        [(head, 0, 1), (tail, 2, 3)],
        grammar='{"grammars": [{"lark_grammar": "start: nowhere"}]}',
    )

    answer = httpx.post(f"{head.endpoint}/v1/generate", json=body, timeout=60)

    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "bad_grammar"
    assert "nowhere" in answer.json()["error"]["message"]
