"""The head's checks of a hop's answer: one without what its step asked for is that hop's fault."""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any

import pytest
import torch

from nodes_app.runtime.head.hop_answers import BadAnswer, choice_of, hidden_of
from nodes_app.runtime.wire.entries import Choice, StepAnswer, TokenScore
from nodes_app.runtime.wire.frames import decode_answers, encode_answers
from nodes_app.runtime.wire.tensors import tensor_to_bytes


def test_a_last_hops_choice_travels_with_the_scores_it_was_asked_for() -> None:
    choice = Choice(
        42,
        TokenScore(-0.25, ((42, -0.25), (7, -1.5))),
        (TokenScore(-3.0, ((1, -0.5), (2, -0.75))), TokenScore(-0.125, ((9, -0.125), (8, -2.0)))),
    )
    [answer] = decode_answers(encode_answers([StepAnswer.chosen(5, choice)]))

    assert choice_of(answer, vocab=64, logprobs=2, prompt_scores=2) == choice


def test_a_plain_choice_answers_its_token_alone() -> None:
    [answer] = decode_answers(encode_answers([StepAnswer.chosen(5, Choice(42))]))

    assert choice_of(answer, vocab=64, logprobs=None, prompt_scores=0) == Choice(42)


@pytest.mark.parametrize(
    ("fields", "logprobs", "prompt_scores"),
    [
        ({"token_id": 64}, None, 0),  # past the vocabulary
        ({"token_id": True}, None, 0),
        ({"token_id": 1}, 1, 0),  # logprobs asked, none answered
        ({"token_id": 1, "logprob": -1.0, "top": []}, 1, 0),  # too few alternatives
        ({"token_id": 1, "logprob": 0.5, "top": [[1, -0.1]]}, 1, 0),  # a positive logprob
        ({"token_id": 1, "logprob": -1.0, "top": [[70, -0.1]]}, 1, 0),  # an unknown alternative
        ({"token_id": 1, "logprob": -1.0}, None, 0),  # logprobs nobody asked for
        ({"token_id": 1}, None, 2),  # an echo without its prompt scores
        ({"token_id": 1, "prompt": [[-1.0, []]]}, None, 2),  # one prompt score short
        ({"token_id": 1, "prompt": [-1.0, -2.0]}, None, 2),
    ],
)
def test_a_last_hops_answer_without_what_was_asked_is_that_hops_fault(
    fields: dict[str, Any], logprobs: int | None, prompt_scores: int
) -> None:
    header = json.dumps({"answers": [{"id": 1, **fields}]}).encode()
    [answer] = decode_answers(struct.pack("<I", len(header)) + header)
    with pytest.raises(BadAnswer):
        choice_of(answer, vocab=64, logprobs=logprobs, prompt_scores=prompt_scores)


def echo_answer(scores: tuple[TokenScore, ...]) -> StepAnswer:
    [answer] = decode_answers(encode_answers([StepAnswer.chosen(5, Choice(1, None, scores))]))
    return answer


@pytest.mark.parametrize(
    ("scores", "vocab"),
    [
        ((TokenScore(-1.0, ((3, -1.0),)), TokenScore(0.5, ((3, -1.0),))), 64),  # positive
        ((TokenScore(-1.0, ((3, float("nan")),)), TokenScore(-1.0, ((3, -1.0),))), 64),
        ((TokenScore(-1.0, ((3, -1.0),)), TokenScore(-1.0, ((64, -1.0),))), 64),  # past vocab
        ((TokenScore(-1.0, ((3, -1.0),)), TokenScore(-1.0, ((-1, -1.0),))), 64),
    ],
)
def test_an_echos_prompt_scores_that_cannot_be_logprobs_are_that_hops_fault(
    scores: tuple[TokenScore, ...], vocab: int
) -> None:
    with pytest.raises(BadAnswer):
        choice_of(echo_answer(scores), vocab=vocab, logprobs=1, prompt_scores=2)


def test_an_echos_prompt_scores_of_another_size_are_that_hops_fault() -> None:
    answer = echo_answer((TokenScore(-1.0, ((3, -1.0),)), TokenScore(-1.0, ((3, -1.0),))))
    with pytest.raises(BadAnswer):
        choice_of(answer, vocab=64, logprobs=1, prompt_scores=3)
    short = dataclasses.replace(answer, prompt_body=(answer.prompt_body or b"")[:-4])
    with pytest.raises(BadAnswer):
        choice_of(short, vocab=64, logprobs=1, prompt_scores=2)


def test_a_middle_hops_hidden_states_are_relayed_as_answered() -> None:
    hidden = tensor_to_bytes(torch.ones(1, 2, 8))
    answer = StepAnswer(1, hidden=hidden, dtype="float32", shape=(1, 2, 8))

    assert hidden_of(answer, (1, 2, 8)) == (hidden, "float32")


@pytest.mark.parametrize(
    ("values", "dtype", "shape"),
    [
        (torch.ones(1, 2, 8), "float32", (1, 3, 8)),  # another shape
        (torch.ones(1, 2, 8), "int8", (1, 2, 8)),  # not a float dtype
        (torch.ones(1, 2, 7), "float32", (1, 2, 8)),  # too few bytes for its shape
        (torch.full((1, 2, 8), float("nan")), "float32", (1, 2, 8)),
    ],
)
def test_a_middle_hops_answer_of_another_shape_or_not_finite_is_that_hops_fault(
    values: torch.Tensor, dtype: str, shape: tuple[int, int, int]
) -> None:
    answer = StepAnswer(1, hidden=tensor_to_bytes(values), dtype=dtype, shape=shape)

    with pytest.raises(BadAnswer):
        hidden_of(answer, (1, 2, 8))


def test_a_draft_rounds_answer_travels_with_the_drafts_it_accepted() -> None:
    [answer] = decode_answers(encode_answers([StepAnswer.chosen(4, Choice(7, accepted=3))]))

    assert choice_of(answer, vocab=259, logprobs=None, prompt_scores=0, drafts=4) == Choice(
        7, accepted=3
    )
    [none] = decode_answers(encode_answers([StepAnswer.chosen(5, Choice(7))]))
    assert choice_of(none, vocab=259, logprobs=None, prompt_scores=0, drafts=4).accepted == 0


@pytest.mark.parametrize(("accepted", "drafts"), [(5, 4), (-1, 4), (True, 4), (1, 0), ("2", 4)])
def test_more_accepted_drafts_than_were_sent_are_that_hops_fault(
    accepted: Any, drafts: int
) -> None:
    answer = StepAnswer(1, token_id=7, accepted=accepted)

    with pytest.raises(BadAnswer, match="accepted drafts"):
        choice_of(answer, vocab=259, logprobs=None, prompt_scores=0, drafts=drafts)


def test_a_scored_rounds_answer_travels_with_a_score_for_every_delivered_token() -> None:
    scores = (TokenScore(-0.5, ((3, -0.5), (9, -1.0))), TokenScore(-0.25, ((4, -0.25), (3, -2.0))))
    choice = Choice(7, TokenScore(-1.0, ((7, -1.0), (1, -1.5))), accepted=2, accepted_scores=scores)
    [answer] = decode_answers(encode_answers([StepAnswer.chosen(4, choice)]))

    assert choice_of(answer, vocab=259, logprobs=2, prompt_scores=0, drafts=3) == choice


def test_a_round_without_logprobs_answers_as_before_rounds_were_scored() -> None:
    """What a head older than scored rounds reads: no field it does not know."""
    frame = encode_answers([StepAnswer.chosen(4, Choice(7, accepted=3))])

    assert b'"accepted":3' in frame and b"accepted_scores" not in frame


@pytest.mark.parametrize(
    ("fields", "logprobs"),
    [
        ({}, 2),  # no draft's score: a hop that scores its own token only
        ({"accepted_scores": [[-0.5, [[3, -0.5], [9, -1.0]]]]}, 2),  # one short
        ({"accepted_scores": [[-0.5, [[3, -0.5]]], [-0.5, [[3, -0.5]]]]}, 2),  # alternatives
        ({"accepted_scores": [[0.5, [[3, -0.5], [9, -1.0]]]] * 2}, 2),  # a positive logprob
        ({"accepted_scores": [[-0.5, [[300, -0.5], [9, -1.0]]]] * 2}, 2),  # past the vocab
        ({"accepted_scores": [-0.5, -0.5]}, 2),  # not [logprob, top]
        ({"accepted_scores": [[-0.5, []]] * 2}, None),  # scores nobody asked for
    ],
)
def test_a_rounds_scores_other_than_one_per_accepted_draft_are_that_hops_fault(
    fields: dict[str, Any], logprobs: int | None
) -> None:
    score = {"logprob": -1.0, "top": [[7, -1.0], [1, -1.5]]} if logprobs else {}
    entry = {"id": 1, "token_id": 7, "accepted": 2, **score, **fields}
    header = json.dumps({"answers": [entry]}).encode()
    [answer] = decode_answers(struct.pack("<I", len(header)) + header)

    with pytest.raises(BadAnswer):
        choice_of(answer, vocab=259, logprobs=logprobs, prompt_scores=0, drafts=3)
