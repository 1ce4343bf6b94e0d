"""The binary node-to-node format: link frames of steps and answers, raw tensor bytes.

A head talks to each downstream hop over one persistent websocket, the hop
*link* (``/v1/link``, docs/adr/0002-node-runtime.md "Hop links"). Every
websocket message is one binary *frame*::

    frame   = u32 little-endian header length | header (compact JSON) | bodies
    header  = {"steps": [entry, ...]}       head → hop
            | {"answers": [answer, ...]}    hop → head
    bodies  = the raw bytes of each entry's tensor, in entry order

A step entry is ``{"id", "bytes", "step": {every ForwardStep field},
"capability"?, "plan"?}``: ``id`` names the step on this link, ``bytes`` the
length of its tensor (T×H little-endian values, row-major, which must equal
its shape × dtype), ``capability`` and ``plan`` the session's credentials
(see ``trust``; the plan only on a session's opening step). A cancel entry
is ``{"id", "cancel": session_id, "capability"?}``. A head opens every link
with a frame of one *hello* entry, ``{"id", "hello": session_id,
"capability"?, "plan"?}`` (the credentials of the first step it will send),
answered ``{"id", "status": 204}`` or refused, and sends nothing else until
then: the hop reads small frames only until a link has shown them
(``link_guard``). An answer is ``{"id",
"bytes", "dtype", "shape"}`` (hidden states), ``{"id", "token_id",
"logprob"?, "top"?, "prompt"?, "bytes"?}`` (the hop ending at the last layer:
the chosen token, its logprob and ``[[id, logprob], ...]`` best alternatives
when the step asked for ``logprobs``, and for an echo ``"prompt": [rows, k]``
with a body of its prompt scores, :class:`PromptTable`), ``{"id", "status":
204}`` (a cancel done) or
``{"id", "status", "code", "type", "message"}`` (refused or failed; a head
relays only the code, ``protocol.errors.relayable_code``, and logs the rest).

A frame carries as many entries as were ready together, so a batch of
steps stays a batch along the route. The one JSON header per frame is a few
hundred bytes; tensors never pass through JSON. The :class:`ForwardStep`
fields travel generically: by name, read as the protocol reads any declared
shape (``nodes_app.protocol.decoding.FieldDecoder``), so a field added to it
needs no change here.

A decode step's frame and a last hop's token answers are on every token's
path, so they may also travel *compact*: the same entries under a binary
header instead of JSON (encoding and decoding a one-step frame and its
answer: ~30 µs with JSON headers, ~13 µs compact)::

    compact = u32 0 | u32 header length | header | bodies
    header  = u8 kind (1 steps, 2 answers) | u16 count | entries
    step    = <IIIIIIIBBB id, bytes, start, end, position, T, H, dtype, flags,
              logprobs | u8 length + UTF-8 session_id | (flags & 1) sender
              | (flags & 2) capability          (each string u8-length-prefixed)
    answer  = <BIIBII tag (1 token, 2 hidden states), id, token id or bytes,
              dtype, T, H

A header length of 0 is never valid JSON, so a node that only reads JSON
refuses a compact frame as malformed: head and hop are upgraded together, as
for the hello. A frame is compact only when every entry fits it (a step whose
other fields are all None: no plan, sampling, reserve or id lists; a token
answer without scores; hidden states of shape ``[1, T, H]``); anything else,
openings, cancels, hellos and refusals, goes as JSON. A compact header is
bounded and checked as strictly as a JSON one: its length against
``max_header`` before it is read, every entry within it, every body declared,
every field refused alone with the JSON form's code (a bad dtype, shape,
session id or logprobs); a header that does not parse closes the link.

This module is the format only; what the head requires of an answer before
it uses it (the token in the vocabulary, the scores asked for) is
``hop_answer``'s.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from nodes_app.protocol.decoding import FieldDecoder, is_count, json_document
from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.limits import ECHO_MAX_SCORES, MAX_SESSION_ID, TOP_LOGPROBS_MAX, echo_scores
from nodes_app.protocol.sampling import SamplingParams
from nodes_app.runtime.errors import RuntimeRequestError
from nodes_app.runtime.sampling import Choice, TokenScore, all_finite

__all__ = [
    "DTYPES",
    "DTYPE_NAMES",
    "CancelEntry",
    "ForwardStep",
    "FrameError",
    "HelloEntry",
    "LinkStep",
    "PromptTable",
    "RefusedEntry",
    "StepAnswer",
    "body_length",
    "decode_answers",
    "decode_requests",
    "encode_answers",
    "encode_requests",
    "is_finite",
    "tensor_from_bytes",
    "tensor_to_bytes",
]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}

_LENGTH = struct.Struct("<I")
# The most entries one frame may hold: far more than any batch a node runs.
MAX_FRAME_ENTRIES = 4096
# Longest credential strings accepted (a capability is 64 hex digits; a plan is
# bounded again, more tightly, when it is parsed).
_MAX_CREDENTIAL = 16384


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
    # For the hop ending at the last layer only (sampling.TailRequest): report the
    # chosen token's logprob with this many alternatives; an echo's prompt ids (the
    # step's first positions); the completion tokens a resumed session starts with,
    # which its penalties count. The id lists are at most the step's positions long,
    # and only the opening step (position 0) carries them.
    logprobs: int | None = None
    prompt_ids: tuple[int, ...] | None = None
    # The step's own token ids, one per position, for a family whose every layer takes
    # an embedding of them (Gemma 4's per-layer inputs: families.Family.per_layer_inputs).
    token_ids: tuple[int, ...] | None = None
    generated_ids: tuple[int, ...] | None = None


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
    """Free ``session_id`` on the hop (its capability presented)."""

    step_id: int
    session_id: str
    capability: str | None = None


@dataclass(frozen=True)
class HelloEntry:
    """A link's first entry: the credentials of a session the head will step (no tensor)."""

    step_id: int
    session_id: str
    capability: str | None = None
    plan: str | None = None

    @classmethod
    def of(cls, entry: LinkStep | CancelEntry) -> HelloEntry:
        """The hello that shows ``entry``'s credentials."""
        if isinstance(entry, CancelEntry):
            return cls(0, entry.session_id, entry.capability)
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


# --- the frame envelope ---------------------------------------------------------------


def _frame(header: dict[str, Any], bodies: Sequence[bytes]) -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([_LENGTH.pack(len(raw)), raw, *bodies])


def _unframe(frame: bytes, key: str, max_header: int | None) -> tuple[list[Any], memoryview]:
    """The entries under ``key`` and the bytes after the header; FrameError if malformed.

    Its sizes are checked before the header is parsed: a header over
    ``max_header`` bytes is refused unread. Nesting is bounded by the parser
    itself (past the interpreter's recursion limit it stops at once: malformed).
    """
    if len(frame) < _LENGTH.size:
        raise FrameError("a frame shorter than its length prefix")
    (length,) = _LENGTH.unpack_from(frame)
    if _LENGTH.size + length > len(frame):
        raise FrameError("a frame shorter than its header")
    if max_header is not None and length > max_header:
        raise FrameError(f"a frame header of {length} bytes, over the {max_header} read")
    try:
        header = json_document(bytes(frame[_LENGTH.size : _LENGTH.size + length]))
    except ValueError:
        raise FrameError("a frame header that is not JSON") from None
    entries = header.get(key) if isinstance(header, dict) else None
    if not isinstance(entries, list) or len(entries) > MAX_FRAME_ENTRIES:
        raise FrameError(f"a frame header without a list of at most {MAX_FRAME_ENTRIES} {key}")
    return entries, memoryview(frame)[_LENGTH.size + length :]


def _split(entries: list[Any], rest: memoryview) -> list[tuple[dict[str, Any], bytes]]:
    """Each entry with its body; FrameError unless ids and byte counts account for the frame."""
    out: list[tuple[dict[str, Any], bytes]] = []
    offset = 0
    for entry in entries:
        if not isinstance(entry, dict) or not is_count(entry.get("id")):
            raise FrameError("a frame entry without an integer id")
        size = entry.get("bytes", 0)
        if not is_count(size) or offset + size > len(rest):
            raise FrameError("a frame entry's bytes run past the frame")
        out.append((entry, bytes(rest[offset : offset + size])))
        offset += size
    if offset != len(rest):
        raise FrameError(f"a frame with {len(rest) - offset} bytes that no entry declares")
    return out


# --- the compact form of steady steps and token answers ---------------------------------

_COMPACT_HEAD = struct.Struct("<IIBH")  # 0, header length, kind, count
_COMPACT_STEP = struct.Struct("<IIIIIIIBBB")
_COMPACT_ANSWER = struct.Struct("<BIIBII")
_COMPACT_STEPS = 1
_COMPACT_ANSWERS = 2
_ANSWER_TOKEN = 1
_ANSWER_HIDDEN = 2
_HAS_SENDER = 1
_HAS_CAPABILITY = 2
_HAS_LOGPROBS = 4
_U32 = 2**32
_DTYPE_CODES = {name: code for code, name in enumerate(DTYPES, start=1)}
_CODE_DTYPES = {code: name for name, code in _DTYPE_CODES.items()}
# The step fields a compact entry carries; every other must be None for it to fit.
_COMPACT_FIELDS = frozenset(
    ("session_id", "start", "end", "position", "dtype", "shape", "sender", "logprobs")
)


def _short(text: str | None) -> bytes | None:
    """``text`` as a compact string (UTF-8, at most 255 bytes); None if it does not fit."""
    if text is None:
        return b""
    raw = text.encode()
    return raw if len(raw) < 256 else None


def _compact_step(entry: LinkStep | CancelEntry | HelloEntry) -> bytes | None:
    """``entry``'s compact header bytes, or None unless it is a step that fits."""
    if not isinstance(entry, LinkStep) or entry.plan is not None:
        return None
    step = entry.step
    for name in _OTHER_FIELDS:
        if getattr(step, name) is not None:
            return None
    shape = step.shape
    code = _DTYPE_CODES.get(step.dtype)
    numbers = (entry.step_id, len(entry.body), step.start, step.end, step.position, *shape[1:])
    logprobs = step.logprobs
    if (
        code is None
        or len(shape) != 3
        or shape[0] != 1
        or not all(0 <= number < _U32 for number in numbers)
        or not (logprobs is None or 0 <= logprobs < 256)
    ):
        return None
    session, sender, capability = (
        _short(step.session_id),
        _short(step.sender),
        _short(entry.capability),
    )
    if session is None or sender is None or capability is None:
        return None
    flags = (
        (_HAS_SENDER if step.sender is not None else 0)
        | (_HAS_CAPABILITY if entry.capability is not None else 0)
        | (_HAS_LOGPROBS if logprobs is not None else 0)
    )
    parts = [
        _COMPACT_STEP.pack(*numbers, code, flags, logprobs or 0),
        bytes((len(session),)),
        session,
    ]
    if step.sender is not None:
        parts += (bytes((len(sender),)), sender)
    if entry.capability is not None:
        parts += (bytes((len(capability),)), capability)
    return b"".join(parts)


def _compact_answer(answer: StepAnswer) -> bytes | None:
    """``answer``'s compact header bytes, or None unless it is a token or hidden states."""
    if answer.status != 200:
        return None
    if answer.hidden is not None:
        shape = answer.shape
        code = _DTYPE_CODES.get(answer.dtype or "")
        if (
            code is None
            or shape is None
            or len(shape) != 3
            or shape[0] != 1
            or not all(isinstance(d, int) and 0 <= d < _U32 for d in shape)
            or len(answer.hidden) >= _U32
        ):
            return None
        return _COMPACT_ANSWER.pack(
            _ANSWER_HIDDEN, answer.step_id, len(answer.hidden), code, shape[1], shape[2]
        )
    token = answer.token_id
    if (
        type(token) is not int
        or not 0 <= token < _U32
        or answer.logprob is not None
        or answer.top is not None
        or answer.prompt is not None
        or answer.prompt_body is not None
    ):
        return None
    return _COMPACT_ANSWER.pack(_ANSWER_TOKEN, answer.step_id, token, 0, 0, 0)


def _compact_frame(kind: int, entries: list[bytes], bodies: Sequence[bytes]) -> bytes:
    header_length = _COMPACT_HEAD.size - 8 + sum(len(entry) for entry in entries)
    head = _COMPACT_HEAD.pack(0, header_length, kind, len(entries))
    return b"".join([head, *entries, *bodies])


def _is_compact(frame: bytes) -> bool:
    return len(frame) >= _LENGTH.size and frame[:4] == b"\0\0\0\0"


def _compact_header(frame: bytes, kind: int, max_header: int | None) -> tuple[int, int, int]:
    """A compact frame's entry count, where its entries start and where its header ends;
    FrameError unless the header is within the frame, ``max_header`` and of ``kind``."""
    if len(frame) < _COMPACT_HEAD.size:
        raise FrameError("a frame shorter than its header")
    _, length, found, count = _COMPACT_HEAD.unpack_from(frame)
    end = 8 + length
    if end > len(frame) or length < _COMPACT_HEAD.size - 8:
        raise FrameError("a frame shorter than its header")
    if max_header is not None and length > max_header:
        raise FrameError(f"a frame header of {length} bytes, over the {max_header} read")
    if found != kind or count > MAX_FRAME_ENTRIES:
        name = "steps" if kind == _COMPACT_STEPS else "answers"
        raise FrameError(f"a frame header without a list of at most {MAX_FRAME_ENTRIES} {name}")
    return count, _COMPACT_HEAD.size, end


def _bodies(frame: bytes, sizes: list[int], end: int) -> list[bytes]:
    """The bodies after a compact header, ``sizes`` bytes each; FrameError unless they
    account for the rest of the frame exactly."""
    if sum(sizes) != len(frame) - end:
        raise FrameError("a frame whose entries' bytes do not account for it")
    view = memoryview(frame)
    out = []
    for size in sizes:
        out.append(bytes(view[end : end + size]))
        end += size
    return out


def _string(frame: bytes, offset: int, end: int) -> tuple[str, int]:
    """The u8-length-prefixed UTF-8 string at ``offset``, and the offset past it."""
    if offset >= end or offset + 1 + frame[offset] > end:
        raise FrameError("a frame entry runs past its header")
    stop = offset + 1 + frame[offset]
    try:
        return frame[offset + 1 : stop].decode(), stop
    except UnicodeDecodeError:
        raise FrameError("a frame header that is not UTF-8") from None


def _decode_compact_requests(frame: bytes, max_header: int | None) -> list[LinkStep | RefusedEntry]:
    count, offset, end = _compact_header(frame, _COMPACT_STEPS, max_header)
    parsed: list[tuple[tuple[int, ...], str, str | None, str | None]] = []
    for _ in range(count):
        if offset + _COMPACT_STEP.size > end:
            raise FrameError("a frame entry runs past its header")
        numbers = _COMPACT_STEP.unpack_from(frame, offset)
        session, offset = _string(frame, offset + _COMPACT_STEP.size, end)
        flags = numbers[8]
        sender = capability = None
        if flags & _HAS_SENDER:
            sender, offset = _string(frame, offset, end)
        if flags & _HAS_CAPABILITY:
            capability, offset = _string(frame, offset, end)
        parsed.append((numbers, session, sender, capability))
    if offset != end:
        raise FrameError(f"a frame header with {end - offset} bytes that no entry declares")
    bodies = _bodies(frame, [numbers[1] for numbers, *_ in parsed], end)
    decoded: list[LinkStep | RefusedEntry] = []
    for (numbers, session, sender, capability), body in zip(parsed, bodies, strict=True):
        step_id, _, start, end_layer, position, rows, width, code, flags, logprobs = numbers
        try:
            step = _compact_fields(
                session, start, end_layer, position, code, rows, width, sender,
                logprobs if flags & _HAS_LOGPROBS else None,
            )  # fmt: skip
        except RuntimeRequestError as error:
            decoded.append(RefusedEntry(step_id, error))
            continue
        decoded.append(LinkStep(step_id, step, body, capability))
    return decoded


def _compact_fields(
    session_id: str,
    start: int,
    end: int,
    position: int,
    code: int,
    rows: int,
    width: int,
    sender: str | None,
    logprobs: int | None,
) -> ForwardStep:
    """A compact entry's step, refused (400) with the code the JSON form would get."""
    if not session_id:
        raise RuntimeRequestError("the step lacks session_id", code="missing_field")
    if len(session_id) > MAX_SESSION_ID:
        raise _bad("session_id is too long")
    dtype = _CODE_DTYPES.get(code)
    if dtype is None:
        raise RuntimeRequestError(
            f"unknown dtype code {code} (one of {', '.join(DTYPES)})", code="bad_dtype"
        )
    if rows < 1 or width < 1:
        raise RuntimeRequestError("shape must be [1, T, H] with T >= 1", code="bad_shape")
    if logprobs is not None:
        _logprobs(logprobs)
    return ForwardStep(
        session_id=session_id,
        start=start,
        end=end,
        position=position,
        dtype=dtype,
        shape=(1, rows, width),
        sampling=None,
        sender=None if sender is None else sender[:MAX_SESSION_ID],
        logprobs=logprobs,
    )


def _decode_compact_answers(frame: bytes) -> list[StepAnswer]:
    count, offset, end = _compact_header(frame, _COMPACT_ANSWERS, None)
    if end - offset != count * _COMPACT_ANSWER.size:
        raise FrameError("a frame header whose entries do not fill it")
    entries = list(_COMPACT_ANSWER.iter_unpack(frame[offset:end]))
    sizes = [value if tag == _ANSWER_HIDDEN else 0 for tag, _, value, _, _, _ in entries]
    answers: list[StepAnswer] = []
    for (tag, step_id, value, code, rows, width), body in zip(
        entries, _bodies(frame, sizes, end), strict=True
    ):
        if tag == _ANSWER_TOKEN:
            answers.append(StepAnswer(step_id, token_id=value))
        elif tag == _ANSWER_HIDDEN:
            answers.append(
                StepAnswer(
                    step_id, hidden=body, dtype=_CODE_DTYPES.get(code), shape=(1, rows, width)
                )
            )
        else:
            raise FrameError(f"an answer of unknown kind {tag}")
    return answers


# --- head → hop ------------------------------------------------------------------------


def encode_requests(entries: Sequence[LinkStep | CancelEntry | HelloEntry]) -> bytes:
    """One frame of steps, cancels and hellos, in order: compact when every entry fits."""
    compact = [item for item in map(_compact_step, entries) if item is not None]
    if len(compact) == len(entries):
        steps = [entry.body for entry in entries if isinstance(entry, LinkStep)]
        return _compact_frame(_COMPACT_STEPS, compact, steps)
    header: list[dict[str, Any]] = []
    bodies: list[bytes] = []
    for entry in entries:
        if isinstance(entry, CancelEntry):
            item: dict[str, Any] = {"id": entry.step_id, "cancel": entry.session_id}
        elif isinstance(entry, HelloEntry):
            item = {"id": entry.step_id, "hello": entry.session_id}
            if entry.plan is not None:
                item["plan"] = entry.plan
        else:
            item = {"id": entry.step_id, "bytes": len(entry.body), "step": step_fields(entry.step)}
            if entry.plan is not None:
                item["plan"] = entry.plan
            bodies.append(entry.body)
        if entry.capability is not None:
            item["capability"] = entry.capability
        header.append(item)
    return _frame({"steps": header}, bodies)


def decode_requests(
    frame: bytes, *, max_header: int | None = None
) -> list[LinkStep | CancelEntry | HelloEntry | RefusedEntry]:
    """The entries of a head's frame; FrameError if the frame itself is malformed (or its
    header is over ``max_header`` bytes: ``protocol.limits.link_header_limit``).

    A step whose fields are malformed (a missing field, a bad shape, dtype or
    sampling) comes back as a :class:`RefusedEntry` with its 400, so that it
    fails alone.
    """
    if _is_compact(frame):
        return list(_decode_compact_requests(frame, max_header))
    entries, rest = _unframe(frame, "steps", max_header)
    decoded: list[LinkStep | CancelEntry | HelloEntry | RefusedEntry] = []
    for entry, body in _split(entries, rest):
        step_id = entry["id"]
        try:
            capability = _credential(entry, "capability")
            for kind in ("cancel", "hello"):
                if kind not in entry:
                    continue
                session_id = entry[kind]
                if not isinstance(session_id, str) or len(session_id) > MAX_SESSION_ID:
                    raise _bad(f"{kind} must name a session id")
                if kind == "cancel":
                    decoded.append(CancelEntry(step_id, session_id, capability))
                else:
                    plan = _credential(entry, "plan")
                    decoded.append(HelloEntry(step_id, session_id, capability, plan))
                break
            else:
                step = step_from_fields(entry.get("step"))
                plan = _credential(entry, "plan")
                decoded.append(LinkStep(step_id, step, body, capability, plan))
        except RuntimeRequestError as error:
            decoded.append(RefusedEntry(step_id, error))
    return decoded


def _credential(entry: dict[str, Any], name: str) -> str | None:
    value = entry.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > _MAX_CREDENTIAL:
        raise _bad(f"{name} must be a string")
    return value


# --- hop → head ------------------------------------------------------------------------


def encode_answers(answers: Sequence[StepAnswer]) -> bytes:
    """One frame of answers, in order: compact when every answer fits."""
    compact = [item for item in map(_compact_answer, answers) if item is not None]
    if len(compact) == len(answers):
        hidden = [answer.hidden for answer in answers if answer.hidden is not None]
        return _compact_frame(_COMPACT_ANSWERS, compact, hidden)
    header: list[dict[str, Any]] = []
    bodies: list[bytes] = []
    for answer in answers:
        item: dict[str, Any] = {"id": answer.step_id}
        if answer.status != 200:
            item.update(
                status=answer.status,
                code=answer.code,
                type=answer.error_type,
                message=answer.message,
            )
        elif answer.hidden is not None:
            item.update(bytes=len(answer.hidden), dtype=answer.dtype, shape=answer.shape)
            bodies.append(answer.hidden)
        else:
            item["token_id"] = answer.token_id
            scores = {"logprob": answer.logprob, "top": answer.top, "prompt": answer.prompt}
            item.update((key, value) for key, value in scores.items() if value is not None)
            if answer.prompt_body is not None:
                item["bytes"] = len(answer.prompt_body)
                bodies.append(answer.prompt_body)
        header.append(item)
    return _frame({"answers": header}, bodies)


def decode_answers(frame: bytes) -> list[StepAnswer]:
    """The answers of a hop's frame, as sent (the head checks each); FrameError if malformed."""
    if _is_compact(frame):
        return _decode_compact_answers(frame)
    entries, rest = _unframe(frame, "answers", None)
    answers: list[StepAnswer] = []
    for entry, body in _split(entries, rest):
        status = entry.get("status", 200)
        if not is_count(status):
            raise FrameError("an answer's status must be an integer")
        shape = entry.get("shape")
        # A last hop's body is an echo's prompt scores; any other's, hidden states.
        scores = "token_id" in entry
        answers.append(
            StepAnswer(
                entry["id"],
                status=status,
                hidden=body if "bytes" in entry and not scores else None,
                dtype=entry.get("dtype") if isinstance(entry.get("dtype"), str) else None,
                shape=tuple(shape) if isinstance(shape, list) else None,
                token_id=entry.get("token_id"),
                logprob=entry.get("logprob"),
                top=entry.get("top"),
                prompt=entry.get("prompt"),
                prompt_body=body if "bytes" in entry and scores else None,
                code=entry.get("code") if isinstance(entry.get("code"), str) else None,
                error_type=entry.get("type") if isinstance(entry.get("type"), str) else None,
                message=str(entry.get("message") or "")[:300],
            )
        )
    return answers


# --- the step's fields, read by their declaration ----------------------------------------

_FIELD_NAMES = tuple(spec.name for spec in fields(ForwardStep))
_OTHER_FIELDS = tuple(name for name in _FIELD_NAMES if name not in _COMPACT_FIELDS)
# Fields that are lists of token ids, bounded by the step's positions.
_TOKEN_LISTS = ("prompt_ids", "generated_ids", "token_ids")


def step_fields(step: ForwardStep) -> dict[str, Any]:
    """Every field of ``step`` as JSON values (None fields left out)."""
    out: dict[str, Any] = {}
    for name in _FIELD_NAMES:
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
            raise _bad(f"{name} holds more ids than the step has positions")
    echoed = echo_scores(len(values.get("prompt_ids") or ()), values.get("logprobs") or 0)
    if echoed > ECHO_MAX_SCORES:
        raise _bad(f"an echo may ask for at most {ECHO_MAX_SCORES} logprobs")
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


def _logprobs(value: Any) -> int:
    if not is_count(value) or value > TOP_LOGPROBS_MAX:
        raise _bad(f"logprobs must be an integer in 0..{TOP_LOGPROBS_MAX}")
    return value


def _refuse(message: str, code: str) -> RuntimeRequestError:
    return RuntimeRequestError(message, code=code)


def _bad(message: str) -> RuntimeRequestError:
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
        "logprobs": _logprobs,
    },
    max_string=MAX_SESSION_ID,
    missing="the step lacks {name}",
    unknown="unknown step fields: {names}",
)


# --- tensors ---------------------------------------------------------------------------


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()


def body_length(step: ForwardStep) -> int:
    """Bytes a step's hidden states take on the wire."""
    return math.prod(step.shape) * DTYPES[step.dtype].itemsize


def is_finite(tensor: torch.Tensor) -> bool:
    """Whether every value is a number (no NaN, no infinity): ``sampling.all_finite``."""
    return all_finite(tensor)


def tensor_from_bytes(body: bytes, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    torch_dtype = DTYPES[dtype]
    expected = math.prod(shape) * torch_dtype.itemsize
    if len(body) != expected:
        raise RuntimeRequestError(
            f"body has {len(body)} bytes; shape {list(shape)} of {dtype} needs {expected}",
            code="bad_length",
        )
    return torch.frombuffer(bytearray(body), dtype=torch_dtype).reshape(shape)
