"""Logprobs, echo, penalties and logit_bias on real nodes, end to end on the node side.

Tiny-model node processes (dev-open, called straight at the head's
``/v1/generate``): a split route (head 0-1, tail 2-3) and a one-node route
(0-3). What they report is compared with the whole model run in this process
by transformers (``LlamaForCausalLM`` with the same seeded weights, a plain
forward and ``log_softmax``), and with each other: a split model must report
what the whole model would. SmolLM2's echo is compared in
``tests/nodes/runtime/test_smollm2_split_equals_whole.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import LlamaForCausalLM

from nodes_app.protocol.limits import ECHO_MAX_SCORES
from nodes_app.runtime.loading.tiny import tiny_config, tiny_state_dict
from nodes_app.shared.prompting import prompt_token_ids
from nodes_app.shared.tokenization import TINY_VOCAB_SIZE, tiny_tokenizer
from tests.support.nodes import (
    TINY,
    generate_body,
    one_node_frames,
    running_nodes,
    split_frames,
)
from tests.support.sse import chunks_of, completion
from tracker_app.localnet import NodeProcess

CONTENT = "Hello there"
PROMPT = "The quick brown fox jumps over the lazy dog."
EOS = 258
TOLERANCE = 1e-4
PREFILL_CHUNK = 8


class WholeModel:
    """The tiny model in this process, as transformers runs it whole."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.model = LlamaForCausalLM(tiny_config())
        self.model.load_state_dict(tiny_state_dict())
        self.model.eval()

    @torch.inference_mode()
    def logprobs(self, ids: list[int]) -> torch.Tensor:
        """``[len(ids), vocab]``: row ``p`` is the log-softmax predicting position ``p + 1``."""
        logits = self.model(torch.tensor([ids])).logits[0].float()
        return torch.log_softmax(logits, dim=-1)

    def greedy(self, prompt: list[int], count: int, *, frequency_penalty: float) -> list[int]:
        """Greedy tokens with OpenAI's frequency penalty, to EOS or ``count``."""
        tokens: list[int] = []
        while len(tokens) < count and (not tokens or tokens[-1] != EOS):
            logits = self.logprobs(prompt + tokens)[-1]
            counts = torch.bincount(
                torch.tensor(tokens, dtype=torch.long), minlength=logits.numel()
            )
            tokens.append(int(torch.argmax(logits - frequency_penalty * counts)))
        return tokens


@pytest.fixture(scope="module")
def whole_model() -> WholeModel:
    return WholeModel()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, NodeProcess]]:
    tmp: Path = tmp_path_factory.mktemp("scoring")
    layouts = {"head": (0, 1), "tail": (2, 3), "whole": (0, 3)}
    # The split route prefills PREFILL_CHUNK positions at a time (an echo's prompt
    # is scored chunk by chunk on the tail); the whole node in one piece.
    chunked = ["--prefill-chunk", str(PREFILL_CHUNK)]
    with running_nodes(
        tmp,
        TINY,
        layouts,
        prefix="scoring",
        timeout=120,
        extra_args={"head": chunked, "tail": chunked},
    ) as started:
        yield started


def entries_of(frames: list[Any]) -> list[dict[str, Any]]:
    """Every token's logprob entry, in order, across the stream's chunks."""
    return [
        entry
        for chunk in chunks_of(frames)
        if chunk.get("meshnet_token_ids")
        for entry in chunk["choices"][0]["logprobs"]["content"]
    ]


def values_of(entries: list[dict[str, Any]]) -> list[list[float]]:
    """Each entry's logprob followed by its alternatives' (what routes must agree on)."""
    return [
        [entry["logprob"], *(top["logprob"] for top in entry["top_logprobs"])] for entry in entries
    ]


def token_bytes(token_id: int) -> list[int]:
    """The tiny tokenizer's bytes of a token: one byte each, none for the three specials."""
    return [token_id] if token_id < 256 else []


def chat_prompt() -> list[int]:
    return prompt_token_ids(tiny_tokenizer(), [{"role": "user", "content": CONTENT}])


def test_a_logit_bias_of_100_makes_greedy_produce_that_token(
    nodes: dict[str, NodeProcess],
) -> None:
    text, ids, _ = completion(split_frames(nodes, max_tokens=6, logit_bias={"65": 100}))
    assert (text, ids) == ("AAAAAA", [65] * 6)


def test_a_strong_frequency_penalty_stops_a_repeated_token_from_repeating(
    nodes: dict[str, NodeProcess], whole_model: WholeModel
) -> None:
    _, plain, _ = completion(split_frames(nodes, max_tokens=20))
    assert max(Counter(plain).values()) > 1  # greedy alone repeats itself here

    _, penalized, _ = completion(split_frames(nodes, max_tokens=20, frequency_penalty=2.0))

    assert max(Counter(penalized).values()) == 1
    assert penalized == whole_model.greedy(chat_prompt(), 20, frequency_penalty=2.0)


@pytest.mark.parametrize("route", [split_frames, one_node_frames], ids=["split", "one-node"])
def test_greedy_logprobs_are_the_whole_models_and_rank_the_chosen_token_first(
    nodes: dict[str, NodeProcess], whole_model: WholeModel, route: Any
) -> None:
    frames = route(nodes, max_tokens=12, logprobs=True, top_logprobs=3)
    text, ids, _ = completion(frames)
    entries = entries_of(frames)
    prompt = chat_prompt()
    expected = whole_model.logprobs(prompt + ids)[len(prompt) - 1 : -1]

    assert len(entries) == len(ids) == 12
    for token, entry, row in zip(ids, entries, expected, strict=True):
        best = row.topk(3)
        assert entry["bytes"] == token_bytes(token)
        assert entry["top_logprobs"][0] == {k: entry[k] for k in ("token", "logprob", "bytes")}
        assert entry["logprob"] == pytest.approx(float(row[token]), abs=TOLERANCE)
        assert [top["bytes"] for top in entry["top_logprobs"]] == [
            token_bytes(i) for i in best.indices.tolist()
        ]
        assert [top["logprob"] for top in entry["top_logprobs"]] == pytest.approx(
            best.values.tolist(), abs=TOLERANCE
        )
    assert bytes(b for entry in entries for b in entry["bytes"]) == text.encode()


def test_logprobs_without_alternatives_report_each_tokens_own_on_a_split_route(
    nodes: dict[str, NodeProcess],
) -> None:
    asked = {"max_tokens": 8, "logprobs": True, "top_logprobs": 0}
    entries = entries_of(split_frames(nodes, **asked))

    assert len(entries) == 8
    assert all(entry["top_logprobs"] == [] for entry in entries)
    assert values_of(entries) == [
        pytest.approx(values, abs=TOLERANCE)
        for values in values_of(entries_of(one_node_frames(nodes, **asked)))
    ]


def test_a_resumed_completion_reports_the_same_logprobs_and_tokens_under_a_penalty(
    nodes: dict[str, NodeProcess],
) -> None:
    asked = {"max_tokens": 16, "logprobs": True, "top_logprobs": 2, "frequency_penalty": 1.0}
    uninterrupted = split_frames(nodes, **asked)
    _, ids, _ = completion(uninterrupted)
    _, plain, _ = completion(split_frames(nodes, max_tokens=16))
    assert ids != plain  # the penalty decides tokens here

    resumed = split_frames(nodes, **asked, resume_token_ids=ids[:6])

    assert completion(resumed)[1] == ids[6:]
    assert values_of(entries_of(resumed)) == [
        pytest.approx(values, abs=TOLERANCE) for values in values_of(entries_of(uninterrupted))[6:]
    ]


def prompt_logprobs(frames: list[Any]) -> tuple[list[int], list[dict[str, Any]]]:
    first = chunks_of(frames)[0]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    return first["meshnet_prompt_token_ids"], first["meshnet_prompt_logprobs"]


def test_an_echo_of_a_raw_prompt_on_a_split_route_reports_what_the_whole_model_does(
    nodes: dict[str, NodeProcess], whole_model: WholeModel
) -> None:
    asked = {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": True, "top_logprobs": 2}
    frames = split_frames(nodes, **asked)
    ids, entries = prompt_logprobs(frames)
    whole_ids, whole_entries = prompt_logprobs(one_node_frames(nodes, **asked))
    expected = whole_model.logprobs(ids)

    assert ids == whole_ids == tiny_tokenizer()(PROMPT)["input_ids"]
    assert len(ids) > 3 * PREFILL_CHUNK  # the split route's tail scored it in several chunks
    assert entries[0] == {"token": "T", "logprob": None, "bytes": [84], "top_logprobs": []}
    assert values_of(entries[1:]) == [
        pytest.approx(values, abs=TOLERANCE) for values in values_of(whole_entries[1:])
    ]
    assert [entry["logprob"] for entry in entries[1:]] == pytest.approx(
        [float(expected[p, token]) for p, token in enumerate(ids[1:])], abs=TOLERANCE
    )
    # max_tokens 0: the prompt ran, nothing was generated.
    _, generated, last = completion(frames)
    assert generated == []
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"] == {
        "prompt_tokens": len(ids),
        "completion_tokens": 0,
        "total_tokens": len(ids),
    }


def test_an_echo_with_tokens_reports_the_prompt_first_then_generates_as_without(
    nodes: dict[str, NodeProcess],
) -> None:
    echoed = split_frames(nodes, prompt=PROMPT, max_tokens=8, echo=True)
    plain = split_frames(nodes, prompt=PROMPT, max_tokens=8)

    ids, entries = prompt_logprobs(echoed)
    assert len(entries) == len(ids)
    assert all(entry["top_logprobs"] == [] for entry in entries)  # no top_logprobs asked
    assert completion(echoed)[:2] == completion(plain)[:2]
    assert "meshnet_prompt_logprobs" not in chunks_of(plain)[0]


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"logit_bias": {str(TINY_VOCAB_SIZE): 5}}, "bad_sampling"),
        ({"prompt": ""}, "invalid_request"),  # no tokens at all
        ({"max_tokens": 0}, "invalid_request"),  # only an echo may generate nothing
        (  # one token (one byte) more than an echo with 20 alternatives may report
            {
                "prompt": "a" * (ECHO_MAX_SCORES // 21 + 1),
                "echo": True,
                "logprobs": True,
                "top_logprobs": 20,
                "max_tokens": 0,
            },
            "prompt_too_long",
        ),
    ],
)
def test_what_the_head_cannot_run_is_refused_with_400(
    nodes: dict[str, NodeProcess], fields: dict[str, Any], code: str
) -> None:
    head, tail = nodes["head"], nodes["tail"]
    body = generate_body([(head, 0, 1), (tail, 2, 3)], **fields)
    answer = httpx.post(f"{head.endpoint}/v1/generate", json=body, timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == code
