"""OpenAI parity through the official Python client, against a real tracker and
real tiny-model nodes.

One network for the module: a head (layers 0-1) and a tail (2-3), and a whole
node (0-3), so a request can pin the split route or the whole one and compare.
The tiny model's weights are seeded: the whole node and the split route hold
the same model.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.network import Network, head_generate, start_network
from tests.support.nodes import TINY
from tracker_app.localnet import fresh_process_database

PROMPT: list[Any] = [{"role": "user", "content": "Tell me about meshes."}]


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("openai-parity")
        for network in start_network(database_url, tmp, MESHNET_RATE_LIMIT_PER_MINUTE="10000"):
            network.add_node("head", TINY, (0, 1))
            network.add_node("tail", TINY, (2, 3))
            network.add_node("whole", TINY, (0, 3))
            network.wait_for_route(TINY)
            yield network


@pytest.fixture(scope="module")
def client(network: Network) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{network.url}/v1", api_key=network.api_key, max_retries=0)


def split(network: Network) -> dict[str, Any]:
    """Pins the head → tail route (Meshnet's ``route``, sent as an extra field)."""
    return {"route": [network.nodes["head"].node_id, network.nodes["tail"].node_id]}


def whole(network: Network) -> dict[str, Any]:
    return {"route": [network.nodes["whole"].node_id]}


def streamed_choices(stream: Any) -> tuple[dict[int, str], dict[int, str], Any]:
    """(text, finish_reason) per choice index, and the usage, of a streamed chat."""
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    usage = None
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
        usage = chunk.usage or usage
    return texts, finishes, usage


# --- n ------------------------------------------------------------------------------


def test_n_greedy_choices_are_each_the_single_answer_streamed_and_not(
    client: openai.OpenAI, network: Network
) -> None:
    common: dict[str, Any] = {"model": TINY, "messages": PROMPT, "max_tokens": 10}
    single = client.chat.completions.create(**common, temperature=0, extra_body=split(network))

    reply = client.chat.completions.create(**common, n=3, temperature=0, extra_body=split(network))
    texts, finishes, usage = streamed_choices(
        client.chat.completions.create(
            **common, n=3, temperature=0, stream=True, extra_body=split(network)
        )
    )

    answer = single.choices[0].message.content
    assert [(c.index, c.message.content) for c in reply.choices] == [
        (0, answer),
        (1, answer),
        (2, answer),
    ]
    assert texts == {0: answer, 1: answer, 2: answer}
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert single.usage is not None and reply.usage is not None and usage is not None
    assert reply.usage.prompt_tokens == usage.prompt_tokens == single.usage.prompt_tokens
    assert reply.usage.completion_tokens == usage.completion_tokens == 30


def test_n_sampled_choices_are_what_seed_seed_plus_one_give_alone(
    client: openai.OpenAI, network: Network
) -> None:
    common: dict[str, Any] = {
        "model": TINY,
        "messages": PROMPT,
        "max_tokens": 12,
        "temperature": 1.0,
        "extra_body": whole(network),
    }
    alone = [
        client.chat.completions.create(**common, seed=seed).choices[0].message.content
        for seed in (5, 6)
    ]

    reply = client.chat.completions.create(**common, seed=5, n=2)
    texts, _, _ = streamed_choices(
        client.chat.completions.create(**common, seed=5, n=2, stream=True)
    )

    assert alone[0] != alone[1]
    assert [c.message.content for c in reply.choices] == alone
    assert texts == {0: alone[0], 1: alone[1]}


def test_more_choices_than_the_tracker_serves_are_a_400_naming_n(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=TINY, messages=PROMPT, n=5)

    assert (refused.value.code, refused.value.param) == ("invalid_request", "n")
    assert "MESHNET_MAX_CHOICES" in refused.value.message


# --- what Meshnet does not do ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("functions", [{"name": "f", "parameters": {}}]),
        ("function_call", "auto"),
        ("modalities", ["text", "audio"]),
        ("reasoning_effort", "high"),
        ("store", True),
    ],
)
def test_asking_for_what_meshnet_does_not_do_is_a_400_naming_it(
    client: openai.OpenAI, name: str, value: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=TINY, messages=PROMPT, max_tokens=4, **{name: value})

    assert (refused.value.code, refused.value.param) == ("unsupported_parameter", name)
    assert name in refused.value.message


def test_asking_for_nothing_meshnet_lacks_is_served(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=TINY,
        messages=PROMPT,
        max_tokens=4,
        temperature=0,  # greedy: a sampled answer may end before its 4 tokens
        tools=[],
        tool_choice="none",
        response_format={"type": "text"},
        store=False,
        extra_body={"a_field_openai_does_not_define": 1},
    )
    # What agent frameworks send by default, tools or none.
    defaults = client.chat.completions.create(
        model=TINY,
        messages=PROMPT,
        max_tokens=4,
        temperature=0,
        tool_choice="auto",
        parallel_tool_calls=False,
    )

    assert reply.usage is not None and reply.usage.completion_tokens == 4
    assert defaults.usage is not None and defaults.usage.completion_tokens == 4


def test_any_other_api_path_is_a_json_404_in_the_error_shape(
    client: openai.OpenAI, network: Network
) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model=TINY, input="meshes")
    answer = httpx.get(f"{network.url}/v1/files/abc/content", timeout=30)

    assert missing.value.code == "not_found"
    assert "/v1/embeddings" in missing.value.message
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["error"]["type"] == "invalid_request_error"


# --- logprobs, penalties, logit_bias on the chat --------------------------------------


def entries_of(logprobs: Any) -> list[tuple[str, float, list[tuple[str, float]]]]:
    """(token, logprob, [(alternative, logprob)…]) of a choice's ``logprobs.content``."""
    return [
        (e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs])
        for e in logprobs.content
    ]


def assert_close(
    got: list[tuple[str, float, list[tuple[str, float]]]],
    expected: list[tuple[str, float, list[tuple[str, float]]]],
    tolerance: float = 1e-4,
) -> None:
    assert [e[0] for e in got] == [e[0] for e in expected]
    for (_, logprob, tops), (_, wanted, wanted_tops) in zip(got, expected, strict=True):
        assert logprob == pytest.approx(wanted, abs=tolerance)
        assert [t for t, _ in tops] == [t for t, _ in wanted_tops]
        assert [p for _, p in tops] == pytest.approx([p for _, p in wanted_tops], abs=tolerance)


def test_chat_logprobs_come_with_every_token_streamed_and_not_and_agree_across_routes(
    client: openai.OpenAI, network: Network
) -> None:
    common: dict[str, Any] = {
        "model": TINY,
        "messages": PROMPT,
        "max_tokens": 10,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    reply = client.chat.completions.create(**common, extra_body=split(network))
    on_whole = client.chat.completions.create(**common, extra_body=whole(network))
    streamed: list[Any] = []
    for chunk in client.chat.completions.create(**common, stream=True, extra_body=split(network)):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content

    choice = reply.choices[0]
    assert choice.logprobs is not None and choice.message.content is not None
    entries = entries_of(choice.logprobs)
    assert len(entries) == reply.usage.completion_tokens == 10
    # Greedy: each token is its position's best alternative, logprobs are log-probabilities.
    for token, logprob, tops in entries:
        assert len(tops) == 3 and tops[0] == (token, logprob) and logprob <= 0
        assert [p for _, p in tops] == sorted((p for _, p in tops), reverse=True)
    text = b"".join(bytes(e.bytes or b"") for e in choice.logprobs.content)
    assert text.decode(errors="replace") == choice.message.content
    assert on_whole.choices[0].logprobs is not None
    assert_close(entries_of(on_whole.choices[0].logprobs), entries)
    assert_close([(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs])
                  for e in streamed], entries)  # fmt: skip


def test_without_logprobs_a_chat_reports_none(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=TINY, messages=PROMPT, max_tokens=3)

    assert reply.choices[0].logprobs is None


def test_penalties_change_the_greedy_answer_alike_on_every_route_streamed_and_not(
    client: openai.OpenAI, network: Network
) -> None:
    common: dict[str, Any] = {"model": TINY, "messages": PROMPT, "max_tokens": 24, "temperature": 0}
    plain = client.chat.completions.create(**common).choices[0].message.content
    penalised: dict[str, Any] = {**common, "frequency_penalty": 2.0, "presence_penalty": 1.5}

    answers = [
        client.chat.completions.create(**penalised, extra_body=route).choices[0].message.content
        for route in (split(network), whole(network))
    ]
    texts, _, _ = streamed_choices(
        client.chat.completions.create(**penalised, stream=True, extra_body=split(network))
    )

    assert answers[0] != plain
    assert answers == [texts[0], texts[0]]


def test_logit_bias_of_100_makes_a_token_the_only_answer_and_of_minus_100_bans_it(
    client: openai.OpenAI,
) -> None:
    common: dict[str, Any] = {"model": TINY, "messages": PROMPT, "max_tokens": 6, "temperature": 0}
    # The tiny model's byte-level vocabulary: token 120 is "x".
    forced = client.chat.completions.create(**common, logit_bias={"120": 100})
    plain = client.chat.completions.create(**common, logprobs=True)
    assert plain.choices[0].logprobs is not None
    first = plain.choices[0].logprobs.content[0]
    banned = client.chat.completions.create(
        **common, logit_bias={str(first.bytes[0]): -100}, logprobs=True, top_logprobs=1
    )
    texts, _, _ = streamed_choices(
        client.chat.completions.create(**common, logit_bias={"120": 100}, stream=True)
    )

    assert forced.choices[0].message.content == texts[0] == "x" * 6
    assert banned.choices[0].logprobs is not None
    assert banned.choices[0].logprobs.content[0].token != first.token
    # The logprobs are the model's own, before the bias: the banned token is still its best.
    assert banned.choices[0].logprobs.content[0].top_logprobs[0].token == first.token


def test_a_logit_bias_outside_the_vocabulary_is_the_clients_400_and_bans_no_one(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=TINY, messages=PROMPT, max_tokens=2, logit_bias={"99999": 5}
        )
    after = client.chat.completions.create(model=TINY, messages=PROMPT, max_tokens=2, temperature=0)

    assert (refused.value.code, refused.value.param) == ("bad_sampling", "logit_bias")
    assert "vocabulary" in refused.value.message
    assert after.usage is not None and after.usage.completion_tokens == 2


def test_stream_options_include_usage_gets_the_usage_on_the_last_chunk(
    client: openai.OpenAI,
) -> None:
    chunks = list(
        client.chat.completions.create(
            model=TINY,
            messages=PROMPT,
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )

    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


# --- the legacy completions endpoint --------------------------------------------------

TEXT = "Once upon a time, a mesh"


def node_text(network: Network, prompt: str, max_tokens: int) -> str:
    """The whole node's own greedy completion of a raw prompt, the tracker bypassed."""
    node = network.nodes["whole"]
    return head_generate(
        network, node, [node.hop()], model=TINY, prompt=prompt, max_tokens=max_tokens,
        temperature=0.0,
    )  # fmt: skip


def streamed_text_choices(stream: Any) -> tuple[dict[int, str], dict[int, str], Any, list[Any]]:
    """(text, finish_reason) per choice index, the usage and every chunk of a streamed
    legacy completion."""
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    usage, chunks = None, []
    for chunk in stream:
        chunks.append(chunk)
        assert chunk.object == "text_completion"
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
        usage = chunk.usage or usage
    return texts, finishes, usage, chunks


def test_a_text_completion_is_the_nodes_own_completion_of_the_raw_prompt(
    client: openai.OpenAI, network: Network
) -> None:
    expected = node_text(network, TEXT, 8)

    reply = client.completions.create(
        model=TINY, prompt=TEXT, max_tokens=8, temperature=0, user="tester"
    )
    texts, finishes, usage, _ = streamed_text_choices(
        client.completions.create(model=TINY, prompt=TEXT, max_tokens=8, temperature=0, stream=True)
    )

    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    assert reply.choices[0].text == texts[0] == expected
    assert reply.choices[0].finish_reason == finishes[0] == "length"
    assert reply.choices[0].logprobs is None
    assert reply.usage is not None and usage is not None
    assert reply.usage.prompt_tokens == usage.prompt_tokens == len(TEXT.encode())  # byte tokens
    assert reply.usage.completion_tokens == usage.completion_tokens == 8


def test_a_list_of_prompts_gets_n_choices_each_in_order(
    client: openai.OpenAI, network: Network
) -> None:
    prompts = [TEXT, "The capital of France"]
    expected = [node_text(network, prompt, 5) for prompt in prompts]

    reply = client.completions.create(model=TINY, prompt=prompts, max_tokens=5, temperature=0, n=2)
    texts, _, usage, _ = streamed_text_choices(
        client.completions.create(
            model=TINY, prompt=prompts, max_tokens=5, temperature=0, n=2, stream=True
        )
    )

    wanted = [expected[0], expected[0], expected[1], expected[1]]
    assert [(c.index, c.text) for c in reply.choices] == list(enumerate(wanted))
    assert texts == dict(enumerate(wanted))
    prompt_tokens = sum(len(p.encode()) for p in prompts)  # each prompt once
    assert reply.usage is not None and usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (prompt_tokens, 20)
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt_tokens, 20)


def test_a_text_completion_stops_at_a_stop_sequence(
    client: openai.OpenAI, network: Network
) -> None:
    full = node_text(network, TEXT, 16)
    stop = full[5:7]  # a piece of the greedy text: it stops before its first occurrence

    reply = client.completions.create(
        model=TINY, prompt=TEXT, max_tokens=16, temperature=0, stop=stop
    )
    texts, finishes, _, _ = streamed_text_choices(
        client.completions.create(
            model=TINY, prompt=TEXT, max_tokens=16, temperature=0, stop=[stop], stream=True
        )
    )

    assert reply.choices[0].text == texts[0] == full[: full.index(stop)]
    assert reply.choices[0].finish_reason == finishes[0] == "stop"


def test_seeded_sampled_text_completions_repeat_and_each_choice_has_its_seed(
    client: openai.OpenAI,
) -> None:
    common: dict[str, Any] = {
        "model": TINY,
        "prompt": TEXT,
        "max_tokens": 10,
        "temperature": 1.3,
        "top_p": 0.95,
    }
    alone = [client.completions.create(**common, seed=s).choices[0].text for s in (11, 12, 11)]

    both = client.completions.create(**common, seed=11, n=2)

    assert alone[0] == alone[2] != alone[1]
    assert [c.text for c in both.choices] == alone[:2]


def test_echo_with_max_tokens_0_scores_the_prompt_alone_streamed_and_not(
    client: openai.OpenAI,
) -> None:
    common: dict[str, Any] = {"model": TINY, "prompt": TEXT, "max_tokens": 0, "echo": True}

    reply = client.completions.create(**common, logprobs=2)
    texts, finishes, usage, chunks = streamed_text_choices(
        client.completions.create(**common, logprobs=2, stream=True)
    )
    bare = client.completions.create(**common)

    choice = reply.choices[0]
    assert choice.text == texts[0] == bare.choices[0].text == TEXT
    assert choice.finish_reason == finishes[0] == "length"
    assert bare.choices[0].logprobs is None
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert "".join(logprobs.tokens) == TEXT  # the tiny model's tokens are its bytes
    assert logprobs.text_offset == list(range(len(TEXT)))
    assert logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    for token, logprob, best in zip(
        logprobs.tokens[1:], logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], strict=True
    ):
        assert logprob is not None and logprob <= 0
        # Two alternatives, and the token itself when it is not among them.
        assert best is not None and 2 <= len(best) <= 3 and best[token] == logprob
    streamed = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    assert [t for lp in streamed for t in lp.tokens] == logprobs.tokens
    assert [o for lp in streamed for o in lp.text_offset] == logprobs.text_offset
    assert reply.usage is not None and usage is not None
    assert (reply.usage.completion_tokens, usage.completion_tokens) == (0, 0)


def test_echo_gives_the_prompt_then_the_completion_with_logprobs_of_both(
    client: openai.OpenAI, network: Network
) -> None:
    completion = node_text(network, TEXT, 4)

    reply = client.completions.create(
        model=TINY, prompt=TEXT, max_tokens=4, temperature=0, echo=True, logprobs=1
    )

    choice = reply.choices[0]
    assert choice.text == TEXT + completion
    assert choice.logprobs is not None and choice.logprobs.tokens is not None
    assert len(choice.logprobs.tokens) == len(TEXT.encode()) + 4
    assert choice.logprobs.text_offset is not None
    assert choice.logprobs.text_offset[len(TEXT)] == len(TEXT)  # the completion's first token


def test_a_split_route_scores_a_prompt_as_the_whole_model_does_within_1e_4(
    client: openai.OpenAI, network: Network
) -> None:
    common: dict[str, Any] = {
        "model": TINY,
        "prompt": "Meshes of nodes hold the layers of one model.",
        "max_tokens": 0,
        "echo": True,
        "logprobs": 5,
    }

    on_split = client.completions.create(**common, extra_body=split(network)).choices[0].logprobs
    on_whole = client.completions.create(**common, extra_body=whole(network)).choices[0].logprobs

    assert on_split is not None and on_whole is not None
    assert on_split.tokens == on_whole.tokens
    assert on_split.token_logprobs is not None and on_whole.token_logprobs is not None
    assert on_split.token_logprobs[0] is None and on_whole.token_logprobs[0] is None
    assert on_split.token_logprobs[1:] == pytest.approx(on_whole.token_logprobs[1:], abs=1e-4)
    for split_best, whole_best in zip(
        on_split.top_logprobs[1:],
        on_whole.top_logprobs[1:],
        strict=True,
    ):
        assert split_best == pytest.approx(whole_best, abs=1e-4)


def test_a_text_completion_refuses_what_it_cannot_serve_in_openais_shape(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as no_echo:
        client.completions.create(model=TINY, prompt=TEXT, max_tokens=0)
    with pytest.raises(openai.BadRequestError) as token_ids:
        client.completions.create(model=TINY, prompt=[1, 2, 3], max_tokens=2)
    with pytest.raises(openai.BadRequestError) as best_of:
        client.completions.create(model=TINY, prompt=TEXT, best_of=3)

    assert (no_echo.value.code, no_echo.value.param) == ("invalid_request", "max_tokens")
    assert (token_ids.value.code, token_ids.value.param) == ("invalid_request", "prompt")
    assert (best_of.value.code, best_of.value.param) == ("unsupported_parameter", "best_of")
