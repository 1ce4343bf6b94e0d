"""A head's speculation along its route: when it is on, what it reports, what it never changes.

A tiny Llama checkpoint on a head and a hop in this process
(``tests/support/in_process_route``), whose greedy answer to a repetitive
prompt repeats itself: prompt-lookup drafts are accepted. The route's timing
is fixed so that drafts pay, except where a test measures it for real.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest

from tests.support.checkpoints import LAYERS, tiny_checkpoint
from tests.support.in_process_route import (
    FixedTimings,
    InProcessRoute,
    OlderHop,
    RecordingHop,
    UnscoredRoundsHop,
)
from tests.support.sse import chunks_of, completion
from tracker_app.completions.structured import response_format_grammar

PROMPT = "the mesh runs the layers; " * 4 + "the mesh"
POINT = {
    "type": "object",
    "properties": {"x": {"type": "number"}, "y": {"type": "boolean"}},
    "required": ["x", "y"],
    "additionalProperties": False,
}
# Logprobs asked, and how close two runs' values must be (a round's positions are one
# forward, plain decoding's one each: sums in another order).
SCORED = {"logprobs": True, "top_logprobs": 3}
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def route(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessRoute]:
    directory = tiny_checkpoint("llama", tmp_path_factory.mktemp("speculation") / "llama")
    served = InProcessRoute(directory, [(0, 2), (3, LAYERS - 1)])
    yield served
    served.close()


def answer(route: InProcessRoute, **fields: Any) -> tuple[str, list[int], dict[str, Any]]:
    fields.setdefault("max_tokens", 16)
    return completion(route.generate(route.body(PROMPT, **fields), timings=FixedTimings()))


def test_drafts_are_sent_and_accepted_and_reported_in_the_usage(route: InProcessRoute) -> None:
    _, ids, last = answer(route)

    usage = last["usage"]
    assert usage["drafted_tokens"] > 0
    assert 0 < usage["accepted_tokens"] <= usage["drafted_tokens"]
    assert usage["completion_tokens"] == len(ids) == 16


def test_speculation_is_off_when_asked(route: InProcessRoute) -> None:
    _, ids, last = answer(route, speculation="off")

    assert len(ids) == 16
    assert "drafted_tokens" not in last["usage"]


def test_sampled_answers_are_the_plain_ones_seed_by_seed_and_drafts_are_accepted(
    route: InProcessRoute,
) -> None:
    """The last hop draws each position's token as plain decoding draws it, from the same
    seeded generator, once per delivered token: seed by seed the same answer, so the
    same distribution of answers (30 seeds, at a temperature where the tiny model still
    repeats itself and drafts are accepted, and at one where they are not)."""
    drafted = accepted = 0
    for seed in range(30):
        fields = {"temperature": 0.05 if seed % 2 else 0.9, "seed": seed}
        _, plain, _ = answer(route, speculation="off", **fields)
        _, ids, last = answer(route, **fields)
        assert ids == plain, seed
        drafted += last["usage"].get("drafted_tokens", 0)
        accepted += last["usage"].get("accepted_tokens", 0)

    assert 0 < accepted <= drafted


def test_speculation_on_is_accepted_as_the_default(route: InProcessRoute) -> None:
    assert answer(route, speculation="on")[1] == answer(route)[1]


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
def test_no_answer_goes_past_max_tokens(route: InProcessRoute, max_tokens: int) -> None:
    _, plain, _ = answer(route, max_tokens=max_tokens, speculation="off")
    _, ids, last = answer(route, max_tokens=max_tokens)

    assert ids == plain
    assert last["usage"]["completion_tokens"] == len(ids) == max_tokens


def test_a_stop_sequence_ends_the_answer_where_plain_decoding_ends_it(
    route: InProcessRoute,
) -> None:
    text, _, _ = answer(route, max_tokens=24, speculation="off")
    stop = text[6:9]
    assert stop and text.count(stop) >= 1

    plain = answer(route, max_tokens=24, speculation="off", stop=[stop])
    spoken = answer(route, max_tokens=24, stop=[stop])

    assert spoken[0] == plain[0] and spoken[1] == plain[1]
    assert spoken[2]["choices"][0]["finish_reason"] == "stop"
    assert spoken[2]["usage"]["completion_tokens"] == len(spoken[1])


def test_a_measured_route_answers_as_plain_decoding_whatever_it_chooses(
    route: InProcessRoute,
) -> None:
    plain = completion(route.generate(route.body(PROMPT, max_tokens=24, speculation="off")))
    measured = completion(route.generate(route.body(PROMPT, max_tokens=24)))

    assert measured[1] == plain[1]


def test_a_hop_that_refuses_draft_rounds_gets_plain_steps_and_the_same_answer(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    directory = tiny_checkpoint("llama", tmp_path_factory.mktemp("older") / "llama")
    three = InProcessRoute(directory, [(0, 1), (2, 3), (4, LAYERS - 1)])
    try:
        plain = completion(three.generate(three.body(PROMPT, max_tokens=16, speculation="off")))
        older = OlderHop(three.services[2])
        three.links.hops[three.endpoints[2]] = older

        _, ids, last = completion(
            three.generate(three.body(PROMPT, max_tokens=16), timings=FixedTimings())
        )
    finally:
        three.close()

    assert ids == plain[1]
    assert older.refused == 1
    assert "drafted_tokens" not in last["usage"]


def test_speculating_and_plain_generations_decoding_together_each_get_their_lone_answer(
    route: InProcessRoute,
) -> None:
    # Two plain generations whose steps meet at the hop (batched), beside two speculating.
    bodies = [
        route.body(PROMPT, max_tokens=20),
        route.body("a different prompt, which runs plainly", max_tokens=20, speculation="off"),
        route.body("and a third that runs plainly too", max_tokens=20, speculation="off"),
        route.body(PROMPT[5:], max_tokens=20),
    ]
    alone = [completion(route.generate(body, timings=FixedTimings()))[1] for body in bodies]

    together = route.generate_together(bodies, timings=FixedTimings())

    assert [completion(frames)[1] for frames in together] == alone
    assert completion(together[0])[2]["usage"]["accepted_tokens"] > 0
    assert route.services[1].scheduler.batched_steps > 0


@pytest.mark.parametrize(
    "fields",
    [
        {"frequency_penalty": 0.6, "presence_penalty": 0.4},
        {"logit_bias": {"101": 3.0}},
        {
            "grammar": response_format_grammar(
                {"type": "json_schema", "json_schema": {"name": "point", "schema": POINT}}
            )
        },
    ],
    ids=["penalties", "logit-bias", "grammar"],
)
def test_a_round_chooses_as_plain_decoding_does_with_the_requests_processors(
    route: InProcessRoute, fields: dict[str, Any]
) -> None:
    plain = answer(route, max_tokens=24, speculation="off", **fields)
    spoken = answer(route, max_tokens=24, **fields)

    assert spoken[1] == plain[1]
    assert spoken[2]["choices"][0]["finish_reason"] == plain[2]["choices"][0]["finish_reason"]


def test_a_grammar_drafts_what_it_forces_and_the_answer_is_the_plain_one(
    route: InProcessRoute,
) -> None:
    """A prompt with nothing to look up: the object's keys and punctuation come from the
    grammar, and the last hop accepts them (they are all the mask allows)."""
    fields = {
        "grammar": response_format_grammar(
            {"type": "json_schema", "json_schema": {"name": "point", "schema": POINT}}
        )
    }
    prompt = "Where is it? Answer as an object."
    off = route.body(prompt, max_tokens=6, speculation="off", **fields)
    plain = completion(route.generate(off))
    spoken = completion(
        route.generate(route.body(prompt, max_tokens=6, **fields), timings=FixedTimings())
    )

    # '{"x":' is forced: after the first token, four drafts accepted in one round trip
    # (prompt lookup finds none of it in the prompt).
    assert spoken[1] == plain[1]
    assert spoken[0].startswith('{"x":')
    assert spoken[2]["usage"]["accepted_tokens"] >= 4


def test_a_resumed_answer_continues_as_plain_decoding_does(route: InProcessRoute) -> None:
    _, whole, _ = answer(route, max_tokens=20, speculation="off")

    _, resumed, last = answer(route, max_tokens=20, resume_token_ids=whole[:6])

    assert resumed == whole[6:]
    assert last["usage"]["completion_tokens"] == 20


class Scored(NamedTuple):
    """An answer of up to 24 tokens with logprobs, as the head streamed it."""

    ids: list[int]
    prompt: list[Any]  # an echo's prompt entries
    entries: list[Any]  # one per answer token
    last: dict[str, Any]


def scored(
    route: InProcessRoute, prompt: str = PROMPT, *, max_tokens: int = 24, **fields: Any
) -> Scored:
    body = route.body(prompt, max_tokens=max_tokens, **SCORED, **fields)
    chunks = chunks_of(route.generate(body, timings=FixedTimings()))
    return Scored(
        ids=[i for chunk in chunks for i in chunk.get("meshnet_token_ids", [])],
        prompt=chunks[0].get("meshnet_prompt_logprobs", []),
        entries=[
            entry
            for chunk in chunks
            for entry in (chunk["choices"][0].get("logprobs") or {}).get("content", [])
        ],
        last=chunks[-1],
    )


def assert_same_scores(spoken: Scored, plain: Scored) -> None:
    """The same tokens, each scored with the same alternatives and logprobs, in order."""

    def tokens(entries: list[Any]) -> list[Any]:
        return [(e["token"], [top["token"] for top in e["top_logprobs"]]) for e in entries]

    def values(entries: list[Any]) -> list[float]:
        return [e["logprob"] for e in entries] + [
            top["logprob"] for e in entries for top in e["top_logprobs"]
        ]

    assert spoken.ids == plain.ids
    assert len(spoken.entries) == len(spoken.ids) > 0
    for mine, theirs in ((spoken.entries, plain.entries), (spoken.prompt, plain.prompt)):
        assert tokens(mine) == tokens(theirs)
        assert values(mine) == pytest.approx(values(theirs), abs=TOLERANCE)


@pytest.mark.parametrize("echo", [False, True], ids=["answer", "echo"])
def test_greedy_logprobs_are_the_plain_ones_with_every_delivered_token_scored(
    route: InProcessRoute, echo: bool
) -> None:
    plain = scored(route, speculation="off", echo=echo)
    recording = RecordingHop(route.services[-1])
    with route.last_hop_as(recording):
        spoken = scored(route, echo=echo)

    assert_same_scores(spoken, plain)
    assert bool(spoken.prompt) is echo
    assert recording.rounds and spoken.last["usage"]["accepted_tokens"] > 0


def test_a_round_that_keeps_its_drafts_scores_each_of_them_and_the_token_after(
    route: InProcessRoute,
) -> None:
    """What the grammar forces, '{"x":', is drafted after the first token and kept: one
    answer delivers five tokens, each scored as plain decoding scores it."""
    fields = {
        "grammar": response_format_grammar(
            {"type": "json_schema", "json_schema": {"name": "point", "schema": POINT}}
        )
    }
    prompt = "Where is it? Answer as an object."
    plain = scored(route, prompt, max_tokens=8, speculation="off", **fields)
    recording = RecordingHop(route.services[-1])
    with route.last_hop_as(recording):
        spoken = scored(route, prompt, max_tokens=8, **fields)

    assert_same_scores(spoken, plain)
    assert recording.rounds[0] == (4, 4)


def test_sampled_logprobs_are_the_plain_ones_seed_by_seed_wherever_a_round_is_cut(
    route: InProcessRoute,
) -> None:
    recording = RecordingHop(route.services[-1])
    for seed in range(6):
        fields: dict[str, Any] = {"temperature": 0.05 if seed % 2 else 0.9, "seed": seed}
        plain = scored(route, speculation="off", **fields)
        with route.last_hop_as(recording):
            spoken = scored(route, **fields)
        assert_same_scores(spoken, plain)

    # Drafts were rejected at several positions of a round, the first among them.
    cut_at = {accepted for drafts, accepted in recording.rounds if accepted < drafts}
    assert 0 in cut_at and len(cut_at) >= 2


def test_a_last_hop_whose_rounds_carry_no_logprobs_gets_plain_steps_and_the_same_scores(
    route: InProcessRoute,
) -> None:
    plain = scored(route, speculation="off")
    older = UnscoredRoundsHop(route.services[-1])
    with route.last_hop_as(older):
        spoken = scored(route)

    assert_same_scores(spoken, plain)
    assert older.refused == 1
    assert "drafted_tokens" not in spoken.last["usage"]
