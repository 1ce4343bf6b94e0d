"""What both completion endpoints accept of OpenAI's parameters, and how they refuse the rest.

The sampling ranges are one set, the protocol's: the tracker accepts exactly
what every node accepts, so no client can get an honest node banned for
sampling it cannot do.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types import completion_create_params as openai_text_params
from openai.types.chat import completion_create_params as openai_chat_params

from meshnet_site.errors import DomainError, http_error
from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.sampling import (
    LOGIT_BIAS_MAX_ENTRIES,
    SEED_MAX,
    TEMPERATURE_MAX,
    TOP_K_MAX,
    TOP_P_MIN,
    SamplingParams,
)
from tests.support.sampling_values import SAMPLING
from tracker_app.completions.chat_request import chat_params_parse
from tracker_app.completions.parameters import (
    CHAT_REFUSED,
    COMPLETIONS_REFUSED,
    GenerationParams,
)
from tracker_app.completions.schema import refused_parameters
from tracker_app.completions.text_request import (
    text_completion_params_parse,
)

CHAT = {"model": "tiny-random-llama", "messages": [{"role": "user", "content": "hi"}]}
TEXT = {"model": "tiny-random-llama", "prompt": "Once upon a time"}

# What a client really sends to ask for each thing Meshnet does not do.
ASKING: dict[str, Any] = {
    "functions": [{"name": "weather", "parameters": {}}],
    "function_call": "auto",
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "draft"},
    "web_search_options": {},
    "reasoning_effort": "low",
    "verbosity": "low",
    "store": True,
    "service_tier": "flex",
    "moderation": {"model": "omni-moderation-latest"},
    "best_of": 3,
    "suffix": " the end.",
}


def chat(**fields: Any) -> GenerationParams:
    return chat_params_parse(json.dumps({**CHAT, **fields}).encode())


def text(**fields: Any) -> GenerationParams:
    return text_completion_params_parse(json.dumps({**TEXT, **fields}).encode())


def refusal(parse: Any, **fields: Any) -> dict[str, Any]:
    """The error body a client gets for ``fields`` (a 400)."""
    with pytest.raises(DomainError) as caught:
        parse(**fields)
    answer = http_error(caught.value)
    assert answer.status == 400
    return dict(answer.body["error"])


def test_every_refused_parameter_has_a_request_that_asks_for_it() -> None:
    assert {r.name for r in CHAT_REFUSED + COMPLETIONS_REFUSED} == set(ASKING)


@pytest.mark.parametrize(
    ("parse", "name"),
    [(chat, r.name) for r in CHAT_REFUSED] + [(text, r.name) for r in COMPLETIONS_REFUSED],
)
def test_asking_for_what_meshnet_does_not_do_is_a_400_naming_the_parameter(
    parse: Any, name: str
) -> None:
    error = refusal(parse, **{name: ASKING[name]})

    assert error["code"] == "unsupported_parameter"
    assert error["param"] == name
    assert error["type"] == "invalid_request_error"
    assert f"'{name}'" in error["message"]


@pytest.mark.parametrize(
    ("parse", "name", "neutral"),
    [(chat, r.name, value) for r in CHAT_REFUSED for value in r.neutral]
    + [(text, r.name, value) for r in COMPLETIONS_REFUSED for value in r.neutral],
)
def test_a_refused_parameter_set_to_ask_for_nothing_is_accepted(
    parse: Any, name: str, neutral: Any
) -> None:
    assert parse(**{name: neutral}).choices == 1


def test_several_refused_parameters_are_named_together() -> None:
    error = refusal(chat, functions=ASKING["functions"], audio=ASKING["audio"])

    assert "'functions'" in error["message"] and "'audio'" in error["message"]
    assert error["param"] == "functions"


@pytest.mark.parametrize(
    ("name", "value"),
    [("store", 0), ("store", "false"), ("functions", {}), ("function_call", "None")],
)
def test_a_value_that_only_looks_neutral_is_refused(name: str, value: Any) -> None:
    # Compared as JSON: 0 is not false, {} is not [], "None" is not "none".
    assert refusal(chat, **{name: value})["param"] == name


@pytest.mark.parametrize("tools", [None, []])
def test_tool_settings_without_tools_ask_for_nothing(tools: Any) -> None:
    fields = {"tool_choice": "auto", "parallel_tool_calls": False}
    assert chat(**fields, **({} if tools is None else {"tools": tools})).choices == 1


def test_the_api_description_names_every_value_a_refused_parameter_accepts() -> None:
    description = refused_parameters(COMPLETIONS_REFUSED)

    assert "`best_of` (accepted: null, 1, or equal to `n`)" in description


def test_best_of_equal_to_n_asks_for_nothing_more() -> None:
    assert text(n=2, best_of=2).choices == 2
    assert refusal(text, n=2, best_of=3)["param"] == "best_of"


def test_fields_openai_does_not_define_are_accepted() -> None:
    assert chat(logit_scale=3, extra_body={"x": 1}, metadata={"run": "7"}).choices == 1
    assert text(unknown=True).choices == 1


def test_openais_optional_fields_may_be_null_and_then_take_their_defaults() -> None:
    nulls = dict.fromkeys(
        [
            "temperature",
            "top_p",
            "seed",
            "presence_penalty",
            "frequency_penalty",
            "logit_bias",
            "n",
            "logprobs",
            "top_logprobs",
            "max_tokens",
            "stream_options",
            "user",
        ]
    )
    params = chat(**nulls)

    assert (params.temperature, params.top_p, params.seed, params.n) == (1.0, 1.0, None, 1)
    assert (params.presence_penalty, params.frequency_penalty, params.logit_bias) == (0, 0, ())
    assert (params.logprobs, params.top_logprobs) == (False, 0)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"presence_penalty": 2.01}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({"logit_bias": {"12": 100.5}}, "logit_bias"),
        ({"logit_bias": {"twelve": 1}}, "logit_bias"),
        ({"logit_bias": {"-3": 1}}, "logit_bias"),
        ({"logit_bias": {"012": 1}}, "logit_bias"),
        ({"logit_bias": {"12": True}}, "logit_bias"),
        ({"logit_bias": [12]}, "logit_bias"),
        ({"n": 0}, "n"),
        ({"n": 5}, "n"),
    ],
)
def test_values_outside_openais_ranges_are_refused_naming_the_field(
    fields: dict[str, Any], param: str
) -> None:
    error = refusal(chat, **fields)

    assert error["code"] == "invalid_request"
    assert error["param"] == param
    assert param in error["message"]


def test_the_edges_of_openais_ranges_are_accepted() -> None:
    biases = {str(token): -100 if token % 2 else 100 for token in range(LOGIT_BIAS_MAX_ENTRIES)}
    params = chat(
        presence_penalty=-2,
        frequency_penalty=2,
        logprobs=True,
        top_logprobs=20,
        logit_bias=biases,
        n=4,
    )

    assert (params.presence_penalty, params.frequency_penalty) == (-2.0, 2.0)
    assert (params.logprobs, params.top_logprobs, params.n) == (True, 20, 4)
    assert len(params.logit_bias) == LOGIT_BIAS_MAX_ENTRIES
    assert refusal(chat, logit_bias={**biases, "300": 1})["param"] == "logit_bias"


@given(
    st.dictionaries(
        st.one_of(st.integers(0, 10**6).map(str), st.text(max_size=3)),
        st.one_of(st.floats(-150, 150), st.integers(-150, 150), st.booleans(), st.none()),
        max_size=5,
    )
)
def test_logit_bias_is_accepted_exactly_when_every_entry_is_a_token_id_and_a_bias_in_range(
    biases: dict[str, Any],
) -> None:
    valid = all(
        re.fullmatch(r"0|[1-9][0-9]{0,9}", token)
        and isinstance(bias, int | float)
        and not isinstance(bias, bool)
        and -100 <= bias <= 100
        for token, bias in biases.items()
    )
    try:
        params = chat(logit_bias=biases)
    except DomainError as error:
        assert not valid, error.message
        return
    assert valid
    assert params.logit_bias == tuple(sorted((int(t), float(b)) for t, b in biases.items()))
    # What the tracker sends on, every node takes.
    sent = params.sampling().to_json()
    assert SamplingParams.from_mapping(sent).logit_bias == params.logit_bias


def test_a_tracker_may_allow_more_choices_than_four() -> None:
    body = json.dumps({**CHAT, "n": 16}).encode()

    assert chat_params_parse(body, max_choices=16).n == 16
    with pytest.raises(DomainError):
        chat_params_parse(body, max_choices=15)


@pytest.mark.parametrize("seed", [None, 0, 41, SEED_MAX])
def test_each_choice_of_a_prompt_samples_with_its_own_seed_and_none_overflows(
    seed: int | None,
) -> None:
    params = text(prompt=["a", "b"], n=2, seed=seed)

    seeds = [params.sampling(choice).seed for choice in range(params.choices)]

    if seed is None:
        assert seeds == [None] * 4
    else:
        # Each prompt's choices: seed, seed + 1 (wrapping within the seeds nodes take).
        assert seeds[:2] == seeds[2:] == [seed, (seed + 1) % (SEED_MAX + 1)]
    assert [params.prompt_of(choice) for choice in range(4)] == ["a", "a", "b", "b"]


# --- one set of sampling ranges, the tracker's and every node's ------------------------

PROMPT = [{"role": "user", "content": "Tell me about meshes."}]
TINY = "tiny-random-llama"


@settings(max_examples=400, deadline=None)
@given(SAMPLING)
def test_the_tracker_accepts_exactly_the_sampling_every_node_accepts(
    fields: dict[str, Any],
) -> None:
    body = json.dumps({"model": TINY, "messages": PROMPT, **fields}).encode()
    try:
        tracker = chat_params_parse(body)
    except DomainError:
        tracker = None
    try:
        node = SamplingParams.from_mapping(fields)
    except ProtocolError:
        node = None
    if tracker is not None:
        # What the tracker sends on, every node takes.
        assert SamplingParams.from_mapping(tracker.sampling().to_json()) == tracker.sampling()
    if node is not None:
        assert tracker is not None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", 2**64),
        ("seed", 2**63),
        ("seed", -1),
        ("top_p", 1e-46),
        ("top_p", 0.0),
        ("temperature", 2.5),
        ("top_k", TOP_K_MAX + 1),
        ("top_k", True),
    ],
)
def test_out_of_range_sampling_is_refused_by_the_tracker_and_the_node_alike(
    field: str, value: Any
) -> None:
    with pytest.raises(ProtocolError) as node:
        SamplingParams.from_mapping({field: value})
    with pytest.raises(DomainError) as tracker:
        chat_params_parse(json.dumps({"model": TINY, "messages": PROMPT, field: value}).encode())
    assert field in node.value.message
    assert field in tracker.value.message


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_in_a_chat_body_are_refused_as_invalid_json(constant: str) -> None:
    body = f'{{"model": "{TINY}", "messages": {json.dumps(PROMPT)}, "temperature": {constant}}}'
    with pytest.raises(DomainError) as caught:
        chat_params_parse(body.encode())
    assert caught.value.code == "invalid_json"


def test_the_edges_of_every_range_are_accepted() -> None:
    params = SamplingParams.from_mapping(
        {"temperature": TEMPERATURE_MAX, "top_p": TOP_P_MIN, "top_k": TOP_K_MAX, "seed": SEED_MAX}
    )
    assert params == SamplingParams(TEMPERATURE_MAX, TOP_P_MIN, TOP_K_MAX, SEED_MAX)
    assert SamplingParams.from_mapping({"temperature": 0, "seed": 0}).greedy


# --- the legacy completions endpoint --------------------------------------------------


# --- the README's table is what the client gets ------------------------------------------

README = Path(__file__).resolve().parents[3] / "README.md"
ENDPOINTS = {"chat": (chat, CHAT_REFUSED), "text": (text, COMPLETIONS_REFUSED)}
# A value of each parameter the table says a client may send.
SENT: dict[str, Any] = {
    "model": "tiny-random-llama",
    "messages": CHAT["messages"],
    "prompt": ["a", "b"],
    "max_tokens": 9,
    "max_completion_tokens": 9,
    "temperature": 0.5,
    "top_p": 0.9,
    "seed": 7,
    "stop": ["\n"],
    "n": 2,
    "stream": True,
    "stream_options": {"include_usage": True},
    "presence_penalty": 0.5,
    "frequency_penalty": -0.5,
    "logit_bias": {"5": -100},
    "logprobs": None,  # per endpoint below
    "top_logprobs": 2,
    "echo": True,
    "user": "someone",
    "metadata": {"run": "1"},
    "safety_identifier": "hash",
    "prompt_cache_key": "k",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "implicit"},
    "parallel_tool_calls": False,
    "response_format": {"type": "json_object"},
    "tools": [{"type": "function", "function": {"name": "weather"}}],
    "tool_choice": "auto",
    "top_k": 40,
    "route": ["node-a"],
}
LOGPROBS = {"chat": True, "text": 3}


def readme_table() -> dict[str, dict[str, str]]:
    """The README's parameter table: endpoint → parameter → its first word there."""
    parity = README.read_text().split("### OpenAI API parity", 1)[1]
    section = re.split(r"\n##+ ", parity, maxsplit=1)[0]
    table: dict[str, dict[str, str]] = {"chat": {}, "text": {}}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        names, chat_cell, text_cell = (cell.strip() for cell in line.strip("|").split("|")[:3])
        for name in re.findall(r"`([a-z_]+)`", names):
            table["chat"][name] = chat_cell.split()[0]
            table["text"][name] = text_cell.split()[0]
    return table


def openai_parameters(params: Any) -> set[str]:
    """What the official client's request type of an endpoint defines."""
    return set(get_type_hints(params.CompletionCreateParamsBase)) | {"stream"}


@pytest.mark.parametrize(
    ("endpoint", "defined"),
    [
        ("chat", openai_parameters(openai_chat_params)),
        ("text", openai_parameters(openai_text_params)),
    ],
)
def test_the_readme_table_says_what_becomes_of_every_parameter_openai_defines(
    endpoint: str, defined: set[str]
) -> None:
    said = {name for name, status in readme_table()[endpoint].items() if status != "—"}

    assert defined - said == set()
    assert said - defined <= {"top_k", "route"}  # Meshnet's own


@pytest.mark.parametrize("endpoint", ["chat", "text"])
def test_the_parameters_the_readme_says_are_refused_are_the_ones_refused(endpoint: str) -> None:
    table = readme_table()[endpoint]
    parse, refused = ENDPOINTS[endpoint]

    assert {name for name, status in table.items() if status == "refused"} == {
        r.name for r in refused
    }
    for name in (name for name, status in table.items() if status == "refused"):
        assert refusal(parse, **{name: ASKING[name]})["param"] == name


@pytest.mark.parametrize("endpoint", ["chat", "text"])
def test_the_parameters_the_readme_says_are_taken_are_taken(endpoint: str) -> None:
    table = readme_table()[endpoint]
    parse, _ = ENDPOINTS[endpoint]
    taken = {name for name, status in table.items() if status in {"supported", "accepted"}}
    assert {status for status in table.values()} <= {"supported", "accepted", "refused", "—"}

    for name in taken:
        value = LOGPROBS[endpoint] if name == "logprobs" else SENT[name]
        fields = {name: value, **({"logprobs": True} if name == "top_logprobs" else {})}
        assert parse(**fields).model == "tiny-random-llama", name
