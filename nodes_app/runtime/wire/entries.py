"""What travels on a hop link: a head's steps, cancels and hellos, and a hop's answers.

The shapes both codecs carry (``frames``: the JSON form, the general one;
``compact``: the binary form of a steady step and a token answer), and the
one way a step's fields are read, by their declaration
(``nodes_app.protocol.decoding.FieldDecoder``), so a field added to
:class:`ForwardStep` needs no codec change. A tail's :class:`Choice` and an
echo's :class:`PromptTable` are answers' shapes too; the sampler produces
them, this package only carries them.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from nodes_app.protocol.decoding import FieldDecoder, is_count
from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.limits import (
    ECHO_MAX_SCORES,
    MAX_SESSION_ID,
    PREFIX_HASH_HEX,
    PREFIX_MAX_BLOCKS,
    TOP_LOGPROBS_MAX,
    echo_scores,
)
from nodes_app.protocol.sampling import SamplingParams
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.wire.tensors import DTYPES

# The most entries one frame may hold: far more than any batch a node runs.
MAX_FRAME_ENTRIES = 4096


@dataclass(frozen=True)
class TokenScore:
    """A token's logprob at a position and the ``(token id, logprob)`` best there, best first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Choice:
    """The last hop's answer to a step: the token, and the scores it was asked to report.

    ``score`` is the chosen token's (when logprobs were asked); ``prompt``
    holds one score per prompt token after the first (an echo). ``accepted``:
    in a draft round, how many of the step's drafts were accepted before
    ``token_id`` (speculative decoding, ADR-0028); ``accepted_scores``, with
    logprobs, each accepted draft's score, in order.
    """

    token_id: int
    score: TokenScore | None = None
    prompt: tuple[TokenScore, ...] = ()
    accepted: int = 0
    accepted_scores: tuple[TokenScore, ...] = ()


@dataclass(frozen=True)
class ForwardStep:
    session_id: str
    start: int
    end: int
    position: int
    dtype: str
    shape: tuple[int, int, int]
    # The hop ending at the last layer's sampling, on the step that opens its session
    # (the session keeps it: later steps leave it out).
    sampling: SamplingParams | None
    sender: str | None = None
    # Positions the session may reach (prompt + max_tokens), what a hop reserves of
    # its KV budget for it; sent on a session's opening step (ADR-0010).
    reserve: int | None = None
    # For the hop ending at the last layer only (engine.sampler.TailRequest): report the
    # chosen token's logprob with this many alternatives; an echo's prompt ids (the
    # step's first positions); the completion tokens a resumed session starts with,
    # which its penalties count. The id lists are at most the step's positions long;
    # only the opening step (position 0) carries prompt ids, and only a session's first
    # step (at 0, or where a prefix claim let the route start: ADR-0027) resumed ids.
    logprobs: int | None = None
    prompt_ids: tuple[int, ...] | None = None
    # The step's own token ids, one per position, for a family whose every layer takes
    # an embedding of them (Gemma 4's per-layer inputs: Family.per_layer_inputs).
    token_ids: tuple[int, ...] | None = None
    generated_ids: tuple[int, ...] | None = None
    # A draft round (speculative decoding, ADR-0028): the step's last positions are
    # these proposed tokens. Every hop may be cut back past them by the next step's
    # position; the hop ending at the last layer verifies them.
    drafts: tuple[int, ...] | None = None


class FrameError(Exception):
    """A frame that is not one: the link that carried it is closed (nothing on it is answered)."""


@dataclass(frozen=True)
class LinkStep:
    """One step as it travels on a link: the step, its tensor bytes, its session's credentials."""

    step_id: int
    step: ForwardStep
    body: bytes
    capability: str | None = None
    plan: str | None = None


@dataclass(frozen=True)
class CancelEntry:
    """Free ``session_id`` on the hop (its capability presented).

    ``keep``: the session ended cleanly and the hop may keep its state in its
    prefix cache under this chain (the block hashes of every token it ran,
    ADR-0027); None: keep nothing.
    """

    step_id: int
    session_id: str
    capability: str | None = None
    keep: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ClaimEntry:
    """Open ``session_id`` on the hop for layers ``start..end`` and find its prefix (ADR-0027).

    ``hashes`` is the chain of the prompt's full blocks; the hop answers how many
    leading blocks it holds (``StepAnswer.blocks``, ``exact``) and keeps them in
    the session until its first step says where the route starts. ``reserve``,
    ``capability`` and ``plan`` are what the session's opening step would carry.
    """

    step_id: int
    session_id: str
    start: int
    end: int
    reserve: int
    hashes: tuple[str, ...]
    capability: str | None = None
    plan: str | None = None


@dataclass(frozen=True)
class HelloEntry:
    """A link's first entry: the credentials of a session the head will step (no tensor)."""

    step_id: int
    session_id: str
    capability: str | None = None
    plan: str | None = None

    @classmethod
    def of(cls, entry: LinkStep | CancelEntry | ClaimEntry) -> HelloEntry:
        """The hello that shows ``entry``'s credentials."""
        if isinstance(entry, CancelEntry):
            return cls(0, entry.session_id, entry.capability)
        if isinstance(entry, ClaimEntry):
            return cls(0, entry.session_id, entry.capability, entry.plan)
        return cls(0, entry.step.session_id, entry.capability, entry.plan)


@dataclass(frozen=True)
class RefusedEntry:
    """A step whose own fields are malformed: refused alone, the rest of its frame stands."""

    step_id: int
    error: RuntimeRequestError


@dataclass(frozen=True)
class StepAnswer:
    """A hop's answer to one entry; ``status`` 200 with ``hidden`` or ``token_id``, else an error.

    ``token_id`` is kept as the hop sent it (any JSON value): the head checks it.
    """

    step_id: int
    status: int = 200
    hidden: bytes | None = None
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    token_id: Any = None
    logprob: Any = None
    top: Any = None
    # An echo's prompt scores: ``[rows, k]`` as sent, and their body (PromptTable).
    prompt: Any = None
    prompt_body: bytes | None = field(default=None, repr=False)
    # A claim's answer: leading blocks of the chain the hop holds, and whether it can
    # resume at that count only (linear-attention states) rather than at any up to it.
    blocks: Any = None
    exact: Any = None
    # A draft round's answer: how many of the step's drafts came before ``token_id``, and
    # with logprobs each one's ``[logprob, top]`` (both left out when none was accepted).
    accepted: Any = None
    accepted_scores: Any = None
    code: str | None = None
    error_type: str | None = None
    message: str = field(default="", repr=False)

    @classmethod
    def chosen(cls, step_id: int, choice: Choice) -> StepAnswer:
        """The last hop's answer: the token and the scores it was asked for, as JSON values."""
        score = choice.score
        table = PromptTable.of(choice.prompt) if choice.prompt else None
        return cls(
            step_id,
            token_id=choice.token_id,
            logprob=None if score is None else score.logprob,
            top=None if score is None else _top_json(score),
            prompt=None if table is None else [table.rows, table.alternatives],
            prompt_body=None if table is None else table.body,
            accepted=choice.accepted if choice.accepted else None,
            accepted_scores=(
                [[score.logprob, _top_json(score)] for score in choice.accepted_scores]
                if choice.accepted_scores
                else None
            ),
        )

    @classmethod
    def refusal(cls, step_id: int, error: RuntimeRequestError) -> StepAnswer:
        return cls(
            step_id,
            status=error.status,
            code=error.code,
            error_type=error.error_type,
            message=error.message,
        )


@dataclass(frozen=True)
class PromptTable:
    """An echo's prompt scores as the last hop sends them: binary, never JSON.

    ``rows`` scores of ``alternatives`` each, as one body: ``rows`` float32
    logprobs, then ``rows × alternatives`` int32 token ids, then as many
    float32 logprobs (row-major, little-endian). Up to
    ``protocol.limits.ECHO_MAX_SCORES`` values: written and checked a whole column at
    a time, not one Python value at a time, so neither node's event loop
    spends long on them (JSON cost ~2 µs a value on each side).
    """

    rows: int
    alternatives: int
    body: bytes

    @classmethod
    def of(cls, scores: Sequence[TokenScore]) -> PromptTable:
        alternatives = len(scores[0].top)
        columns = (
            array("f", [score.logprob for score in scores]),
            array("i", [token for score in scores for token, _ in score.top]),
            array("f", [value for score in scores for _, value in score.top]),
        )
        if sys.byteorder == "big":
            for column in columns:
                column.byteswap()
        return cls(len(scores), alternatives, b"".join(column.tobytes() for column in columns))

    def columns(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The body's columns: ``rows`` chosen logprobs, then the alternatives' ids and
        logprobs (``rows × alternatives`` each); None unless the body is exactly that long."""
        rows, k = self.rows, self.alternatives
        if len(self.body) != rows * 4 * (1 + 2 * k):
            return None
        floats = torch.frombuffer(bytearray(self.body), dtype=torch.float32)
        ids = floats[rows : rows + rows * k].view(torch.int32).view(rows, k)
        return floats[:rows], ids, floats[rows + rows * k :].view(rows, k)


def _top_json(score: TokenScore) -> list[list[int | float]]:
    return [[token, logprob] for token, logprob in score.top]


STEP_FIELD_NAMES = tuple(spec.name for spec in fields(ForwardStep))
# Fields that are lists of token ids, bounded by the step's positions.
_TOKEN_LISTS = ("prompt_ids", "generated_ids", "token_ids", "drafts")


def step_fields(step: ForwardStep) -> dict[str, Any]:
    """Every field of ``step`` as JSON values (None fields left out)."""
    out: dict[str, Any] = {}
    for name in STEP_FIELD_NAMES:
        value = getattr(step, name)
        if value is None:
            continue
        if isinstance(value, SamplingParams):
            value = value.to_json()
        elif isinstance(value, tuple):
            value = list(value)
        out[name] = value
    return out


def step_from_fields(raw: Any) -> ForwardStep:
    """A :class:`ForwardStep` from its JSON fields; a 400 naming the first bad one.

    ``shape`` must be ``[1, T, H]`` with T, H >= 1, ``dtype`` one of
    :data:`DTYPES`, ``sampling`` valid sampling parameters (see
    ``SamplingParams.from_mapping``); any other field must have its declared
    type (integers non-negative, strings at most ``MAX_SESSION_ID``
    characters); a field must be present unless it has a default or may be None.
    """
    if not isinstance(raw, dict):
        raise RuntimeRequestError("a step entry needs its step fields", code="missing_field")
    values = _STEP.decode(raw)
    if not values["session_id"]:
        raise RuntimeRequestError("the step lacks session_id", code="missing_field")
    for name in _TOKEN_LISTS:
        if len(values.get(name) or ()) > values["shape"][1]:
            raise bad_field(f"{name} holds more ids than the step has positions")
    if values.get("drafts") is not None and not 0 < len(values["drafts"]) < values["shape"][1]:
        raise bad_field("drafts follow the step's first position: 1 to T - 1 of them")
    echoed = echo_scores(len(values.get("prompt_ids") or ()), values.get("logprobs") or 0)
    if echoed > ECHO_MAX_SCORES:
        raise bad_field(f"an echo may ask for at most {ECHO_MAX_SCORES} logprobs")
    return ForwardStep(**values)


def _shape(value: Any) -> tuple[int, int, int]:
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not all(isinstance(d, int) and not isinstance(d, bool) for d in value)
        or value[0] != 1
        or value[1] < 1
        or value[2] < 1
    ):
        raise RuntimeRequestError("shape must be [1, T, H] with T >= 1", code="bad_shape")
    return (value[0], value[1], value[2])


def _dtype(value: Any) -> str:
    if value not in DTYPES:
        raise RuntimeRequestError(
            f"unknown dtype {value!r} (one of {', '.join(DTYPES)})", code="bad_dtype"
        )
    return str(value)


def _sampling(value: Any) -> SamplingParams:
    try:
        return SamplingParams.from_mapping(value)
    except ProtocolError as error:
        raise RuntimeRequestError.refusing(error) from None


def read_logprobs(value: Any) -> int:
    if not is_count(value) or value > TOP_LOGPROBS_MAX:
        raise bad_field(f"logprobs must be an integer in 0..{TOP_LOGPROBS_MAX}")
    return value


def _refuse(message: str, code: str) -> RuntimeRequestError:
    return RuntimeRequestError(message, code=code)


def bad_field(message: str) -> RuntimeRequestError:
    return RuntimeRequestError(message, code="bad_field")


# A null field is an absent one; every field not read here is checked by its type.
_STEP = FieldDecoder(
    ForwardStep,
    refuse=_refuse,
    bad_code="bad_field",
    readers={
        "shape": _shape,
        "dtype": _dtype,
        "sampling": _sampling,
        "sender": lambda value: str(value)[:MAX_SESSION_ID],
        "logprobs": read_logprobs,
    },
    max_string=MAX_SESSION_ID,
    missing="the step lacks {name}",
    unknown="unknown step fields: {names}",
)


def read_block_hashes(value: Any, name: str) -> tuple[str, ...]:
    """A chain of block hashes as a claim or a cancel carries it; a 400 ``bad_field`` unless
    it is a list of at most ``PREFIX_MAX_BLOCKS`` strings of ``PREFIX_HASH_HEX`` hex digits."""
    if not isinstance(value, list) or len(value) > PREFIX_MAX_BLOCKS:
        raise bad_field(f"{name} must be a list of at most {PREFIX_MAX_BLOCKS} block hashes")
    for item in value:
        if not (
            isinstance(item, str)
            and len(item) == PREFIX_HASH_HEX
            and all(c in "0123456789abcdef" for c in item)
        ):
            raise bad_field(f"{name} must hold block hashes of {PREFIX_HASH_HEX} hex digits")
    return tuple(value)
