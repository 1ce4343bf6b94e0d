"""What a client is told of the prompt tokens its route took from the nodes' prefix caches
(ADR-0027): the head's ``cached_tokens``, in each API's own usage field."""

from __future__ import annotations

import json
from typing import Any

from drf_spectacular.generators import SchemaGenerator

from nodes_app.protocol.frames import ChunkFrame
from nodes_app.protocol.sampling import SamplingParams
from nodes_app.protocol.usage import Usage
from routing_app.policies.choice import DecisionMode, RouteDecision
from tests.support.probe_answers import SPLIT
from tracker_app.completions.chat_answer import ChatAnswer
from tracker_app.completions.chat_request import chat_params_parse
from tracker_app.completions.generation import Generation, Segment
from tracker_app.completions.messages_answer import MessagesAnswer
from tracker_app.completions.messages_request import messages_params_parse
from tracker_app.completions.prompt_tokens import PromptCount
from tracker_app.completions.recording import Completion
from tracker_app.completions.responses_answer import ResponsesAnswer
from tracker_app.completions.responses_request import responses_params_parse
from tracker_app.completions.shapes import usage_of
from tracker_app.completions.text_answer import TextCompletionAnswer
from tracker_app.completions.text_request import text_completion_params_parse

ROUTE: Any = {"route": "r", "mode": "pinned", "hops": []}
USAGE = usage_of(100, 5, 64)


def finished(choice: int = 0, *, prompt: int = 100, cached: int = 64) -> Generation:
    generation = Generation(
        choice=choice, prompt="p", prompt_count=PromptCount(prompt, True), sampling=SamplingParams()
    )
    generation.segments.append(Segment(RouteDecision(SPLIT, DecisionMode.PINNED, 1), 0, 0.0))
    generation.absorb(
        ChunkFrame(
            content="Hi", token_ids=(1,), finish_reason="stop", usage=Usage(prompt, 1, cached)
        ),
        request_id="r",
    )
    return generation


def events(raw: bytes) -> list[dict[str, Any]]:
    return [
        json.loads(line.removeprefix(b"data: "))
        for line in raw.split(b"\n")
        if line.startswith(b"data: {")
    ]


def test_usage_says_how_many_prompt_tokens_were_cached() -> None:
    assert USAGE["prompt_tokens_details"] == {"cached_tokens": 64}
    assert USAGE["prompt_tokens"] == 100 and USAGE["total_tokens"] == 105


def test_a_chat_answer_reports_cached_tokens_whole_and_in_the_last_chunk() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    params = chat_params_parse(json.dumps(body).encode())
    answer = ChatAnswer(completion_id="c", created=1, params=params)

    whole = answer.reply([finished()], USAGE, ROUTE)
    [last] = events(answer.finish(0, "stop", USAGE))

    assert whole["usage"]["prompt_tokens_details"] == {"cached_tokens": 64}
    assert last["usage"]["prompt_tokens_details"] == {"cached_tokens": 64}


def test_a_text_completion_reports_cached_tokens() -> None:
    params = text_completion_params_parse(json.dumps({"model": "m", "prompt": "p"}).encode())

    whole = TextCompletionAnswer(completion_id="c", created=1, params=params).reply(
        [finished()], USAGE, ROUTE
    )

    assert whole["usage"]["prompt_tokens_details"] == {"cached_tokens": 64}


def test_a_message_reports_cache_read_input_tokens() -> None:
    body = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}
    params = messages_params_parse(json.dumps(body).encode())
    answer = MessagesAnswer(completion_id="msg_1", created=1, params=params)

    whole = answer.reply([finished()], USAGE, ROUTE)
    delta = [e for e in events(answer.finish(0, "stop", USAGE)) if e["type"] == "message_delta"]

    assert whole["usage"] == {
        "input_tokens": 100,
        "output_tokens": 5,
        "cache_read_input_tokens": 64,
    }
    assert delta[0]["usage"]["cache_read_input_tokens"] == 64


def test_a_response_reports_cached_input_tokens() -> None:
    params = responses_params_parse(json.dumps({"model": "m", "input": "hi"}).encode())

    whole = ResponsesAnswer(completion_id="resp_1", created=1, params=params).reply(
        [finished()], USAGE, ROUTE
    )

    usage = whole["usage"]
    assert usage is not None and usage["input_tokens_details"]["cached_tokens"] == 64


def test_the_openapi_usage_documents_the_cached_prompt_tokens() -> None:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    components = schema["components"]["schemas"]

    usage = components["Usage"]
    assert "prompt_tokens_details" in usage["required"]
    details = components["PromptTokensDetails"]
    assert details["required"] == ["cached_tokens"]
    assert details["properties"]["cached_tokens"]["minimum"] == 0


def test_a_choice_counts_what_its_finishing_route_reported_never_past_its_prompt() -> None:
    generation = finished(prompt=100, cached=64)
    assert generation.cached_tokens == 64
    # A route that failed over: the replayed route's head reports its own count.
    generation.segments.append(Segment(RouteDecision(SPLIT, DecisionMode.PINNED, 1), 1, 0.0))
    assert generation.cached_tokens == 0


def test_a_request_counts_each_prompts_cached_tokens_once_as_it_counts_its_prompt() -> None:
    # n = 2: both choices of one prompt; the prompt counted once, as prompt_tokens is.
    choices = [finished(0, cached=64), finished(1, cached=32)]

    completion = Completion.of(choices, n=2, elapsed=1.0, first_token_after=0.1)

    assert (completion.prompt_tokens, completion.cached_tokens) == (100, 64)
    # Each choice's hops are paid for what they computed.
    assert [w.tokens for w in completion.work] == [(100 - 64 + 1) + (100 - 32 + 1)] * 2
