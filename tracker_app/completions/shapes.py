"""The JSON the completion endpoints answer with, each shape declared once.

Every shape is a ``TypedDict``: the answer modules build their dicts through
them (:mod:`~tracker_app.completions.chat_answer`,
:mod:`~tracker_app.completions.text_answer`), so mypy holds each answer to its
declaration, and a ``TypedDict`` costs nothing at run time (it is a plain
dict: a streamed token pays no more than a dict literal). :func:`component`
turns the same declaration into the drf-spectacular serializer that the
OpenAPI schema documents (:mod:`~tracker_app.completions.schema`): the class
name is the component's name (but for the few :data:`COMPONENT_NAMES` renames),
the docstring its description, and what a type cannot say (a count is never
negative) rides as ``Annotated`` metadata.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import NoneType, UnionType
from typing import (
    Annotated,
    Any,
    Literal,
    NotRequired,
    TypedDict,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from meshnet_site.api_schema import constant
from routing_app.api import HopOutput
from routing_app.policies.choice import DecisionMode


@dataclass(frozen=True)
class Bounds:
    """The least and most a number may be, in the schema."""

    minimum: int | None = None
    maximum: int | None = None


@dataclass(frozen=True)
class Documented:
    """A field documented by a serializer field declared elsewhere (another app's shape)."""

    field: Callable[[], serializers.Field[Any, Any, Any, Any]]


Count = Annotated[int, Bounds(minimum=0)]
FinishReason = Literal["stop", "length"]
# A chat choice also ends in "tool_calls" when its answer is a call of the request's tools.
ChatFinishReason = Literal["stop", "length", "tool_calls"]


class PromptTokensDetails(TypedDict):
    """Of the prompt tokens, those the route took from its nodes' prefix caches rather
    than recomputing them (ADR-0027), billed at the model's cached price."""

    cached_tokens: Count


# A chat or text completion's ``usage``: the tokens it is billed for. The Messages and
# Responses answers read theirs from it (``cache_read_input_tokens``,
# ``input_tokens_details.cached_tokens``).
class CompletionUsage(TypedDict):
    prompt_tokens: Count
    completion_tokens: Count
    total_tokens: Count
    prompt_tokens_details: PromptTokensDetails


class MeshnetSpeculation(TypedDict):
    """Speculative decoding's share of the answer (ADR-0028): the drafts the heads sent
    through their routes, and those accepted (each a delivered token)."""

    drafted: Count
    accepted: Count


class MeshnetRoute(TypedDict):
    """The route serving the request: signature, how it was chosen, its hops; in a
    whole reply (``stream: false``) and a stream's last event also ``speculation``."""

    route: str
    mode: Annotated[str, Documented(lambda: serializers.ChoiceField(choices=_MODES))]
    hops: Annotated[list[dict[str, Any]], Documented(lambda: HopOutput(many=True))]
    speculation: NotRequired[MeshnetSpeculation]


_MODES = [str(mode) for mode in DecisionMode]


class CalledFunction(TypedDict):
    name: str
    # The arguments as JSON text, valid for the function's parameters schema.
    arguments: str


class ToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: CalledFunction


class FunctionDelta(TypedDict, total=False):
    name: str
    arguments: str


class ToolCallDelta(TypedDict):
    """A streamed tool call, as OpenAI sends one: its first delta names it (``id``,
    ``type``, ``function.name``, empty arguments), the next carries its arguments."""

    index: Count
    id: NotRequired[str]
    type: NotRequired[Literal["function"]]
    function: FunctionDelta


class AssistantMessage(TypedDict):
    """The answer: text, or (``content`` null) the calls of the request's tools."""

    role: Literal["assistant"]
    content: str | None
    tool_calls: NotRequired[list[ToolCall]]


# One of a chat token's ``top_logprobs``.
class ChatTopLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[Annotated[int, Bounds(minimum=0, maximum=255)]]


# A chat token's entry of ``logprobs.content``.
class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob]


class ChoiceLogprobs(TypedDict):
    """With ``logprobs: true``: each token's log-probability, and its ``top_logprobs``."""

    content: list[ChatTokenLogprob]


class ChatChoice(TypedDict):
    index: Count
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: ChatFinishReason


class ChatCompletion(TypedDict):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: CompletionUsage
    meshnet: MeshnetRoute


class ChatDelta(TypedDict, total=False):
    # The first delta has the role, the last neither.
    role: Literal["assistant"]
    content: str
    tool_calls: list[ToolCallDelta]


class ChatChunkChoice(TypedDict):
    index: Count
    delta: ChatDelta
    logprobs: NotRequired[ChoiceLogprobs | None]
    finish_reason: ChatFinishReason | None


class ChatCompletionChunk(TypedDict):
    """One ``data:`` event of a streamed answer: the first carries ``meshnet``, the last
    ``finish_reason``, ``usage`` and ``meshnet`` again, with ``speculation``."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    meshnet: NotRequired[MeshnetRoute]
    usage: NotRequired[CompletionUsage]


class LegacyLogprobs(TypedDict):
    """OpenAI's legacy log-probabilities, one entry per token of the choice's text (the
    prompt's first with ``echo``: its first token has none, ``null``)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[Count]


class TextChoice(TypedDict):
    text: str
    index: Count
    logprobs: LegacyLogprobs | None
    finish_reason: FinishReason


class TextCompletion(TypedDict):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: CompletionUsage
    meshnet: MeshnetRoute


class TextChunkChoice(TypedDict):
    text: str
    index: Count
    logprobs: LegacyLogprobs | None
    finish_reason: FinishReason | None


class TextCompletionChunk(TypedDict):
    """One ``data:`` event of a streamed legacy answer: the first carries ``meshnet``, the
    last ``finish_reason``, ``usage`` and ``meshnet`` again, with ``speculation``."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChunkChoice]
    meshnet: NotRequired[MeshnetRoute]
    usage: NotRequired[CompletionUsage]


def usage_of(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> CompletionUsage:
    """A request's ``usage``: what it is billed for, ``cached_tokens`` of its prompt at
    the cached price."""
    return CompletionUsage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


# --- the schema's view of the same declarations --------------------------------------

Serializer = serializers.Serializer[dict[str, Any]]
# The shapes whose component is not named as the class: the document calls them as
# OpenAI's does, and the classes say they are the client's JSON, not the protocol's
# dataclasses of the same names (``nodes_app.protocol.usage``, ``….logprobs``).
COMPONENT_NAMES: dict[type, str] = {
    CompletionUsage: "Usage",
    ChatTopLogprob: "TopLogprob",
    ChatTokenLogprob: "TokenLogprob",
}
_components: dict[type, type[Serializer]] = {}


def component(shape: type) -> type[Serializer]:
    """The serializer documenting ``shape`` (a ``TypedDict`` above) as a named schema
    component: one class per shape, however often it is nested."""
    if shape not in _components:
        name = COMPONENT_NAMES.get(shape, shape.__name__)
        hints = get_type_hints(shape, include_extras=True)
        # NotRequired (read from the hint: under postponed annotations Python 3.11's
        # ``__optional_keys__`` misses it) or a ``total=False`` shape.
        optional: frozenset[str] = getattr(shape, "__optional_keys__", frozenset())
        fields = {name: _field(hint, required=name not in optional) for name, hint in hints.items()}
        serializer = type(name, (serializers.Serializer,), fields)
        serializer.__doc__ = shape.__doc__
        _components[shape] = extend_schema_serializer(component_name=name)(serializer)
    return _components[shape]


def _field(hint: Any, **kwargs: Any) -> serializers.Field[Any, Any, Any, Any]:
    """The serializer field that documents a value of type ``hint``."""
    if get_origin(hint) is NotRequired:
        return _field(get_args(hint)[0], **(kwargs | {"required": False}))
    if get_origin(hint) is Annotated:
        inner, *metadata = get_args(hint)
        for item in metadata:
            if isinstance(item, Documented):
                return item.field()
            if isinstance(item, Bounds):
                kwargs |= {"min_value": item.minimum, "max_value": item.maximum}
        return _field(inner, **{k: v for k, v in kwargs.items() if v is not None})
    if get_origin(hint) in (Union, UnionType) and NoneType in get_args(hint):
        (inner,) = (arg for arg in get_args(hint) if arg is not NoneType)
        return _field(inner, allow_null=True, **kwargs)
    if get_origin(hint) is Literal:
        values = list(get_args(hint))
        if len(values) == 1:
            return constant(values[0], **kwargs)
        return serializers.ChoiceField(choices=values, **kwargs)
    if get_origin(hint) is list:
        (item,) = get_args(hint)
        if is_typeddict(item):
            return component(item)(many=True, **kwargs)
        return serializers.ListField(child=_field(item), **kwargs)
    if get_origin(hint) is dict:
        _, value = get_args(hint)
        return serializers.DictField(child=_field(value), **kwargs)
    if is_typeddict(hint):
        return component(hint)(**kwargs)
    simple: dict[Any, type[serializers.Field[Any, Any, Any, Any]]] = {
        str: serializers.CharField,
        int: serializers.IntegerField,
        float: serializers.FloatField,
    }
    return simple[hint](**kwargs)
