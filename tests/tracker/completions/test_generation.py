"""One choice of a request: what it gives the client as frames arrive, what it bills, and
which of the client's stop sequences ended it. (The head held to the client's limits is
in ``tests/tracker/test_served_answers.py``.)"""

from __future__ import annotations

from collections.abc import Sequence

from nodes_app.protocol.frames import ChunkFrame
from nodes_app.protocol.logprobs import TokenLogprob
from nodes_app.protocol.sampling import SamplingParams
from nodes_app.protocol.usage import Usage
from routing_app.policies.choice import DecisionMode, RouteDecision
from tests.support.probe_answers import SPLIT
from tracker_app.completions.generation import Generation, Segment
from tracker_app.completions.parameters import Prompt
from tracker_app.completions.prompt_tokens import PromptCount


def choice(prompt: Prompt = "Once upon", *, count: PromptCount | None = None) -> Generation:
    generation = Generation(
        choice=1,
        prompt=prompt,
        prompt_count=count or PromptCount(4, True),
        sampling=SamplingParams(),
    )
    generation.segments.append(Segment(RouteDecision(SPLIT, DecisionMode.PINNED, 1), 0, 0.0))
    return generation


class Spelling:
    """A tokenizer whose token id ``n`` spells ``WORDS[n]``."""

    WORDS = ["Hello", " there", "END", ".", "STOP"]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.WORDS[i] for i in ids)


def test_each_frame_with_text_is_a_piece_of_the_choice_and_its_tokens_are_kept() -> None:
    generation = choice()

    hello = generation.absorb(ChunkFrame(content="Hello", token_ids=(0,)), request_id="r")
    held = generation.absorb(ChunkFrame(content="", token_ids=(1,)), request_id="r")
    there = generation.absorb(ChunkFrame(content=" there", token_ids=()), request_id="r")

    assert hello is not None and (hello.choice, hello.text) == (1, "Hello")
    assert held is None  # a token whose text is held back gives the client nothing yet
    assert there is not None and there.text == " there"
    assert (generation.token_ids, generation.content) == ([0, 1], "Hello there")
    assert generation.segments[-1].produced == 2


def test_a_choice_bills_the_trackers_own_count_of_its_prompt_not_the_heads() -> None:
    exact, bounded = choice(), choice(count=PromptCount(10, False))

    for generation in (exact, bounded):
        generation.absorb(
            ChunkFrame(content="Hi", token_ids=(0,), finish_reason="stop", usage=Usage(7, 1)),
            request_id="r",
        )

    assert (exact.prompt_tokens, bounded.prompt_tokens) == (4, 7)
    assert exact.finished and exact.finish_reason == "stop"


def test_a_choice_is_delivered_whole_once_finished_and_every_token_sent() -> None:
    generation = choice()
    generation.absorb(ChunkFrame(content="Hi", token_ids=(0,)), request_id="r")
    generation.mark_delivered()
    assert not generation.delivered_whole  # not finished yet

    generation.absorb(ChunkFrame(content=".", token_ids=(3,), finish_reason="stop"), request_id="r")
    assert not generation.delivered_whole  # its last token not sent yet
    generation.mark_delivered()
    assert generation.delivered_whole


def test_a_choice_cut_before_its_usage_bills_the_prompt_only_when_counted_exactly() -> None:
    exact, bounded = choice(), choice(count=PromptCount(10, False))

    exact.prompt_settled()
    bounded.prompt_settled()

    assert (exact.prompt_tokens, bounded.prompt_tokens) == (4, 0)


def test_the_stop_sequence_that_ended_a_choice_is_read_from_its_tokens() -> None:
    generation = choice()
    generation.absorb(ChunkFrame(content="Hello there", token_ids=(0, 1)), request_id="r")
    generation.absorb(ChunkFrame(content="", token_ids=(2,), finish_reason="stop"), request_id="r")

    assert generation.stopped_by(["STOP", "END"], Spelling()) == "END"
    assert generation.stopped_by(["STOP"], Spelling()) is None
    assert generation.stopped_by(["END"], None) is None  # no tokenizer here: not known


def test_a_choice_ended_by_its_length_names_no_stop_sequence() -> None:
    generation = choice()
    generation.absorb(
        ChunkFrame(content="", token_ids=(2,), finish_reason="length"), request_id="r"
    )

    assert generation.stopped_by(["END"], Spelling()) is None


def test_an_echo_gives_the_prompt_back_once_with_its_scores() -> None:
    generation = choice("Once upon")
    scores = (TokenLogprob("Once", None, tuple(b"Once"), ()),)

    piece = generation.echo(ChunkFrame(content="", token_ids=(), prompt_logprobs=scores))

    assert (piece.choice, piece.text, piece.echo, piece.logprobs) == (1, "Once upon", True, scores)
    assert generation.echoed and generation.prompt_logprobs == scores
