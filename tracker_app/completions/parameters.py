"""What both completion endpoints take of an OpenAI request, and what they refuse.

``/v1/chat/completions`` (:mod:`tracker_app.completions.chat_request`) and the legacy
``/v1/completions`` (:mod:`tracker_app.completions.text_request`) share their sampling
fields, ``n``, ``stop``, ``route`` and the way a body is read
(:func:`request_fields`): each parses into one :class:`GenerationParams`, what
the proxy runs. Their ranges are OpenAI's (and, for what a node checks again,
the protocol's).

OpenAI defines parameters Meshnet does not honour (audio, the older functions, …). A client
that asks for one and silently does not get it is worse off than one that is
told, so each is listed here (:data:`CHAT_REFUSED`, :data:`COMPLETIONS_REFUSED`)
with the values that ask for nothing (``functions: []``, ``null``), and any
other value is a 400 ``unsupported_parameter`` naming it
(:func:`unsupported_refuse`, run by each endpoint's serializer first). Fields
OpenAI does not define stay accepted: clients send extras.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from meshnet_site.environment import MAX_CHOICES
from meshnet_site.errors import DomainError, ErrorKind, validation_message
from nodes_app.protocol.decoding import json_document
from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.generate import (
    SPECULATION_OFF,
    SPECULATION_ON,
    speculation_allowed,
    stop_sequences,
)
from nodes_app.protocol.limits import MAX_STOP_LENGTH, MAX_STOPS
from nodes_app.protocol.sampling import (
    LOGIT_BIAS_MAX,
    LOGIT_BIAS_MAX_ENTRIES,
    PENALTY_MAX,
    PENALTY_MIN,
    SAMPLING_VALUES,
    SEED_MAX,
    TEMPERATURE_MAX,
    TOP_K_MAX,
    TOP_P_MIN,
    SamplingParams,
    logit_bias_pairs,
)
from tracker_app.completions.tools import ToolUse

MAX_MAX_TOKENS = 4096
# The most choices any deployment may allow (MESHNET_MAX_CHOICES's own ceiling).
CHOICES_CEILING = int(MAX_CHOICES.maximum or 1)
DEFAULT_MAX_CHOICES = int(MAX_CHOICES.default)

# What a generation starts from: chat messages (the head applies the model's chat
# template) or, for a legacy completion, raw text (tokenised as the tokenizer does).
Messages = list[dict[str, Any]]
Prompt = Messages | str


class InvalidRequest(DomainError):
    """The request body is not one Meshnet can serve; the message names why."""

    kind = ErrorKind.INVALID
    code = "invalid_request"


class UnsupportedParameter(DomainError):
    """The request asks for something OpenAI defines and Meshnet does not do."""

    kind = ErrorKind.INVALID
    code = "unsupported_parameter"


@dataclass(frozen=True)
class Refused:
    """An OpenAI parameter Meshnet does not honour, and the values of it that ask for
    nothing (compared strictly: ``false`` is not ``0``)."""

    name: str
    neutral: tuple[Any, ...] = (None,)
    why: str = ""
    # Also neutral when equal to this other field's value (its default when absent).
    same_as: tuple[str, Any] | None = None

    def asks_for_nothing(self, value: Any, body: Mapping[str, Any]) -> bool:
        if any(_same_json(value, neutral) for neutral in self.neutral):
            return True
        if self.same_as is not None:
            other, default = self.same_as
            return _same_json(value, body.get(other, default))
        return False


def _same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values: ``true`` is not ``1``, ``1`` is not ``1.0``."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


CHAT_REFUSED: tuple[Refused, ...] = (
    Refused("functions", (None, []), "the older function calling: use tools"),
    Refused("function_call", (None, "none"), "the older function calling: use tool_choice"),
    Refused("audio", (None,), "text only"),
    Refused("modalities", (None, ["text"]), "text only"),
    Refused("prediction", (None,), "no predicted outputs"),
    Refused("web_search_options", (None,), "no web search"),
    Refused("reasoning_effort", (None,), "no reasoning controls"),
    Refused("verbosity", (None,), "no verbosity controls"),
    Refused("store", (None, False), "completions are not stored for later retrieval"),
    Refused("service_tier", (None, "auto", "default"), "one service tier"),
    Refused("moderation", (None,), "no moderation"),
)

COMPLETIONS_REFUSED: tuple[Refused, ...] = (
    Refused("best_of", (None, 1), "no server-side best-of selection", same_as=("n", 1)),
    Refused("suffix", (None, ""), "no insertion (fill-in-the-middle)"),
)


def unsupported_refuse(body: Mapping[str, Any], refused: Sequence[Refused]) -> None:
    """Raise :class:`UnsupportedParameter` naming every parameter of ``refused`` that
    ``body`` sets to something other than a neutral value."""
    asked = [r for r in refused if r.name in body and not r.asks_for_nothing(body[r.name], body)]
    if asked:
        names = ", ".join(f"'{r.name}'" for r in asked)
        reasons = "; ".join(f"{r.name}: {r.why}" for r in asked)
        raise UnsupportedParameter(
            f"Meshnet does not support {names} ({reasons}); leave it out or null",
            param=asked[0].name,
        )


def fields_refuse(
    body: Mapping[str, Any], *, api: str, known: Iterable[str], refused: Sequence[Refused]
) -> None:
    """Raise :class:`UnsupportedParameter` for a parameter of ``refused`` that ``body`` asks
    for, else for the first field ``body`` sets that ``api`` neither knows nor refuses."""
    unsupported_refuse(body, refused)
    unknown = sorted(set(body) - set(known) - {r.name for r in refused})
    if unknown:
        names = ", ".join(f"'{name}'" for name in unknown)
        raise UnsupportedParameter(
            f"Meshnet's {api} API does not support {names}", param=unknown[0]
        )


def _no_constant(name: str) -> Any:
    # Python's json reads NaN and Infinity, which JSON itself does not allow.
    raise json.JSONDecodeError(f"{name} is not a JSON value", name, 0)


def request_fields(body: bytes) -> dict[str, Any]:
    """The JSON object of a request body; :class:`InvalidRequest` if it is not one."""
    try:
        raw = json_document(body or b"null", parse_constant=_no_constant)
    except ValueError as exc:  # malformed, nested too deeply, or not UTF-8
        raise InvalidRequest(
            f"Request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    if not isinstance(raw, dict):
        raise InvalidRequest("Request body must be a JSON object")
    return raw


def fields_validate(
    serializer: serializers.Serializer[dict[str, Any]],
) -> dict[str, Any]:
    """The serializer's validated data, or :class:`InvalidRequest` naming every bad field
    (``param``: the first)."""
    if serializer.is_valid():
        return serializer.validated_data
    errors = serializer.errors
    named = [key for key in errors if key != "non_field_errors"]
    raise InvalidRequest(validation_message(errors), param=named[0] if named else None)


@extend_schema_field(
    {
        "type": "object",
        "description": "Token id (decimal) → bias added to its logit",
        "additionalProperties": {
            "type": "number",
            "minimum": -LOGIT_BIAS_MAX,
            "maximum": LOGIT_BIAS_MAX,
        },
        "propertyNames": {"pattern": "^(0|[1-9][0-9]{0,9})$"},
        "maxProperties": LOGIT_BIAS_MAX_ENTRIES,
        "nullable": True,
    }
)
class LogitBiasField(serializers.JSONField):
    """``logit_bias``: token id (a decimal string, as JSON keys are) → bias in -100..100,
    at most 300 entries, checked by the nodes' own rule (``protocol.logit_bias_pairs``);
    whether an id is in the vocabulary is the node's to say."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        try:
            logit_bias_pairs(value)
        except ProtocolError as error:
            raise serializers.ValidationError(error.message) from None
        return value


_STOP = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_LENGTH}


@extend_schema_field(
    {
        "oneOf": [_STOP, {"type": "array", "items": _STOP, "maxItems": MAX_STOPS}],
        "nullable": True,
    }
)
class StopSequencesField(serializers.JSONField):
    """``stop``: one sequence or a list of them (:meth:`GenerationFields.validate_stop`)."""


def speculation_field() -> serializers.ChoiceField:
    """A request's ``speculation`` (Meshnet's extension): ``"on"`` (the default) lets the
    heads speculate where it pays, ``"off"`` asks for plain decoding (ADR-0028)."""
    return serializers.ChoiceField(
        choices=[SPECULATION_ON, SPECULATION_OFF], required=False, allow_null=True
    )


class GenerationFields(serializers.Serializer[dict[str, Any]]):
    """The fields both completion endpoints take. OpenAI's optional fields may be null,
    which means their default."""

    # (Not in the docstring: it is the schema's description of each request.) The whole
    # of an endpoint's validation: the OpenAI parameters it refuses (``refused``, checked
    # first: UnsupportedParameter), every field, and the choices the deployment allows
    # (``context["max_choices"]``, MESHNET_MAX_CHOICES).
    refused: tuple[Refused, ...] = ()

    model = serializers.CharField(max_length=64)
    stream = serializers.BooleanField(default=False)
    # The sampling ranges are the protocol's, which every node checks again.
    temperature = serializers.FloatField(
        min_value=0.0, max_value=TEMPERATURE_MAX, required=False, allow_null=True
    )
    top_p = serializers.FloatField(
        min_value=TOP_P_MIN, max_value=1.0, required=False, allow_null=True
    )
    top_k = serializers.IntegerField(min_value=0, max_value=TOP_K_MAX, default=0)
    seed = serializers.IntegerField(
        min_value=0, max_value=SEED_MAX, required=False, allow_null=True, default=None
    )
    frequency_penalty = serializers.FloatField(
        min_value=PENALTY_MIN, max_value=PENALTY_MAX, required=False, allow_null=True
    )
    presence_penalty = serializers.FloatField(
        min_value=PENALTY_MIN, max_value=PENALTY_MAX, required=False, allow_null=True
    )
    logit_bias = LogitBiasField(required=False, allow_null=True)
    stop = StopSequencesField(required=False, default=None, allow_null=True)
    n = serializers.IntegerField(
        min_value=1, max_value=CHOICES_CEILING, required=False, allow_null=True
    )
    # Usage always comes on the last chunk of a stream; the options ask for nothing more.
    stream_options = serializers.DictField(required=False, allow_null=True)
    route = serializers.ListField(
        child=serializers.CharField(max_length=64), allow_empty=False, required=False
    )
    speculation = speculation_field()
    user = serializers.CharField(required=False, allow_blank=True, allow_null=True)

    def validate_stop(self, value: Any) -> list[str]:
        """The nodes' own rule (``protocol.stop_sequences``); absent or null: none."""
        try:
            return stop_sequences(value)
        except ProtocolError as error:
            raise serializers.ValidationError(error.message) from None

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, Mapping):
            unsupported_refuse(data, self.refused)
        return super().to_internal_value(data)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # The nodes' own check, so the tracker never forwards what a node refuses.
        try:
            SamplingParams.from_mapping(
                {key: attrs[key] for key in SAMPLING_VALUES if attrs.get(key) is not None}
            )
        except ProtocolError as error:
            raise serializers.ValidationError(error.message) from None
        self._choices_check(n=attrs.get("n") or 1, prompts=self.prompts_in(attrs))
        return attrs

    def prompts_in(self, attrs: dict[str, Any]) -> int:
        """How many prompts the request holds (each has its ``n`` choices)."""
        return 1

    def _choices_check(self, *, n: int, prompts: int) -> None:
        """Refuse more choices than a request may ask for (MESHNET_MAX_CHOICES)."""
        max_choices = self.context.get("max_choices", DEFAULT_MAX_CHOICES)
        if n * prompts <= max_choices:
            return
        asked = (
            f"n = {n}" if prompts == 1 else f"{prompts} prompts × n = {n}: {n * prompts} choices"
        )
        raise serializers.ValidationError(
            {
                "n": f"{asked}; this tracker serves at most {max_choices} choices a request "
                "(MESHNET_MAX_CHOICES)"
            }
        )


@dataclass(frozen=True)
class GenerationParams:
    """One completion request as the proxy runs it: ``n`` choices for each prompt.

    Choice ``i`` runs ``prompts[i // n]``; sampled with ``seed + i % n`` when a
    seed is given, so each prompt's choices differ and each is what the same
    prompt alone would give. ``logprobs``/``top_logprobs`` ask the tail for the
    model's log-probabilities; ``echo`` (legacy completions) for the prompt's own.
    """

    model: str
    prompts: tuple[Prompt, ...]
    stream: bool
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), ids increasing
    stop: list[str] = field(default_factory=list)
    route: list[str] | None = None
    # Whether the heads may speculate (ADR-0028): a request's ``"speculation": "off"``
    # (Meshnet's extension, like ``route``) asks for plain decoding.
    speculation: bool = True
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    echo: bool = False
    # The grammar every choice follows (``structured.response_format_grammar``, or the
    # tool calls' ``tools.ToolUse.grammar``), and the tools the answer may call.
    grammar: str | None = None
    tool_use: ToolUse | None = None
    # The request field that asks for the output's format (errors name it).
    format_param: str = "response_format"
    # A chat's messages as the client sent them, and the tools the head's chat template
    # renders when it renders tool calls itself (``chat_request.chat_params_for_model``).
    messages: tuple[Mapping[str, Any], ...] = ()
    template_tools: tuple[Mapping[str, Any], ...] = ()
    # What the answer repeats of the request (the Responses API's ``instructions``, …).
    echoed: Mapping[str, Any] = field(default_factory=dict)

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n

    @property
    def prompt_scored(self) -> bool:
        """Whether the heads are asked to score the prompt (an ``echo`` the nodes run).

        An echo without logprobs is only the prompt's text, which the tracker
        gives back itself; with ``max_tokens: 0`` the heads score it all the
        same, as a head must have something to do.
        """
        return self.echo and (self.logprobs or self.max_tokens == 0)

    def prompt_of(self, choice: int) -> Prompt:
        return self.prompts[choice // self.n]

    def sampling(self, choice: int = 0) -> SamplingParams:
        """The sampling parameters the head takes for ``choice``."""
        seed = None if self.seed is None else (self.seed + choice % self.n) % (SEED_MAX + 1)
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=self.logit_bias,
            grammar=self.grammar,
        )


def generation_params(
    v: Mapping[str, Any],
    *,
    prompts: tuple[Prompt, ...],
    max_tokens: int,
    **more: Any,
) -> GenerationParams:
    """:class:`GenerationParams` from a :class:`GenerationFields` subclass's validated
    data (nulls become OpenAI's defaults); ``more`` are the endpoint's own fields."""
    n = v.get("n") or 1

    def given(name: str, default: Any) -> Any:
        value = v.get(name)
        return default if value is None else value

    return GenerationParams(
        model=v["model"],
        prompts=prompts,
        stream=v["stream"],
        max_tokens=max_tokens,
        temperature=given("temperature", 1.0),
        top_p=given("top_p", 1.0),
        top_k=v["top_k"],
        seed=v["seed"],
        presence_penalty=given("presence_penalty", 0.0),
        frequency_penalty=given("frequency_penalty", 0.0),
        logit_bias=logit_bias_pairs(v.get("logit_bias")),
        stop=v["stop"],
        route=v.get("route"),
        speculation=speculation_allowed(v.get("speculation")),
        n=n,
        **more,
    )
