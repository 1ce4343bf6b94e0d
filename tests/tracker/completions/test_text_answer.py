"""The legacy ``text_completion`` answer: its logprobs, offsets and chunks."""

from __future__ import annotations

import json
from itertools import pairwise
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodes_app.protocol.logprobs import TokenLogprob, TopLogprob
from tracker_app.completions.generation import Generation, Piece
from tracker_app.completions.prompt_tokens import PromptCount
from tracker_app.completions.shapes import usage_of
from tracker_app.completions.text_answer import TextCompletionAnswer, TextOffsets, legacy_logprobs
from tracker_app.completions.text_request import text_completion_params_parse


def entry(piece: bytes, logprob: float | None = -1.0, *tops: tuple[str, float]) -> TokenLogprob:
    return TokenLogprob(
        token=piece.decode(errors="replace"),
        logprob=logprob,
        utf8=tuple(piece),
        top_logprobs=tuple(TopLogprob(t, p, tuple(t.encode())) for t, p in tops),
    )


@st.composite
def text_in_pieces(draw: st.DrawFn) -> tuple[str, list[bytes]]:
    """A text and its UTF-8 bytes cut anywhere (a byte-level BPE may cut a character)."""
    text = draw(st.text(max_size=30))
    raw = text.encode()
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(raw) - 1)), max_size=len(raw))))
    bounds = [0, *[c for c in cuts if c < len(raw)], len(raw)]
    return text, [raw[a:b] for a, b in pairwise(bounds) if b > a]


@given(text_in_pieces())
def test_each_token_starts_after_the_characters_its_predecessors_completed(
    case: tuple[str, list[bytes]],
) -> None:
    text, pieces = case
    offsets = TextOffsets()

    starts = [offsets.advance(entry(piece), echoed=False) for piece in pieces]

    done = 0
    for piece, start in zip(pieces, starts, strict=True):
        assert start == len(text.encode()[:done].decode(errors="ignore"))
        done += len(piece)
    assert offsets.characters == len(text)


def test_an_echoed_special_token_counts_as_its_written_form_a_generated_one_as_nothing() -> None:
    special = TokenLogprob(token="<|im_end|>", logprob=-0.5, utf8=())
    offsets = TextOffsets(prompt="a<|im_end|>b")

    starts = [
        offsets.advance(entry(b"a"), echoed=True),
        offsets.advance(special, echoed=True),
        offsets.advance(entry(b"b"), echoed=True),
        offsets.advance(special, echoed=False),
        offsets.advance(entry(b"c"), echoed=False),
    ]

    assert starts == [0, 1, 11, 12, 12]


def test_a_bos_the_tokenizer_added_shifts_no_echoed_offset() -> None:
    bos = TokenLogprob(token="<|endoftext|>", logprob=None, utf8=())
    offsets = TextOffsets(prompt="Hi")

    starts = [offsets.advance(token, echoed=True) for token in (bos, entry(b"H"), entry(b"i"))]

    assert starts == [0, 0, 1]
    assert offsets.characters == len("Hi")


def test_legacy_logprobs_give_the_top_alternatives_with_the_token_itself_and_null_first() -> None:
    entries = [
        entry(b"A", None),
        entry(b"b", -2.0, ("c", -0.5), ("d", -1.0)),
        entry(b"c", -0.5, ("c", -0.5), ("d", -1.0)),
    ]

    logprobs = legacy_logprobs(entries, top=1, offsets=TextOffsets(), echoed=True)

    assert logprobs == {
        "tokens": ["A", "b", "c"],
        "token_logprobs": [None, -2.0, -0.5],
        "top_logprobs": [None, {"c": -0.5, "b": -2.0}, {"c": -0.5}],
        "text_offset": [0, 1, 2],
    }


def test_partial_character_tokens_are_spelled_as_bytes_and_keep_their_own_logprobs() -> None:
    check, cross = "✓".encode()[:1], "✗".encode()[:2]  # each part of a character
    chosen = TokenLogprob(
        token="\ufffd",
        logprob=-2.0,
        utf8=tuple(cross),
        top_logprobs=(
            TopLogprob("\ufffd", -0.1, tuple(check)),
            TopLogprob("\ufffd", -2.0, tuple(cross)),
        ),
    )

    logprobs = legacy_logprobs([chosen], top=2, offsets=TextOffsets())

    assert logprobs["tokens"] == ["bytes:\\xe2\\x9c"]
    assert logprobs["top_logprobs"] == [{"bytes:\\xe2": -0.1, "bytes:\\xe2\\x9c": -2.0}]
    top = logprobs["top_logprobs"][0]
    assert top is not None
    assert max(top, key=top.__getitem__) != logprobs["tokens"][0]  # lm-eval: not greedy


def test_alternatives_spelled_alike_keep_the_better_logprob() -> None:
    chosen = entry(b"c", -1.0, ("c", -0.5), ("c", -1.0))

    logprobs = legacy_logprobs([chosen], top=2, offsets=TextOffsets())

    assert logprobs["top_logprobs"] == [{"c": -0.5}]


def test_a_streamed_choices_logprobs_are_the_whole_replys_piece_by_piece() -> None:
    params = text_completion_params_parse(
        json.dumps(
            {"model": "m", "prompt": "Hé", "echo": True, "logprobs": 1, "max_tokens": 2}
        ).encode()
    )
    answer = TextCompletionAnswer(completion_id="cmpl-1", created=1, params=params)
    prompt = (entry(b"H", None), entry("é".encode(), -1.5, ("e", -0.1)))
    completion = [entry(b"!", -0.2, ("!", -0.2)), entry("✓".encode()[:1], -3.0, ("?", -1.0))]
    generation = Generation(
        choice=0, prompt="Hé", prompt_count=PromptCount(2, True), sampling=params.sampling()
    )
    generation.prompt_logprobs = prompt
    generation.logprobs = completion
    generation.texts = ["!"]
    generation.finish_reason = "length"

    events = [
        answer.piece(Piece(0, text="Hé", logprobs=prompt, echo=True)),
        answer.piece(Piece(0, text="!", logprobs=tuple(completion))),
    ]
    whole = answer.reply(
        [generation], usage_of(2, 2), {"route": "r", "mode": "pinned", "hops": []}
    )["choices"][0]

    chunks: list[dict[str, Any]] = [json.loads(event[6:]) for event in events]
    streamed = [chunk["choices"][0]["logprobs"] for chunk in chunks]
    assert whole["text"] == "Hé!"
    assert whole["logprobs"] is not None
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [v for part in streamed for v in part[key]] == whole["logprobs"][key]
    assert whole["logprobs"]["text_offset"] == [0, 1, 2, 3]
