"""The compact form of a link frame: a binary header for the frames on every token's path.

A session's steady decode steps and a tail's token answers travel under a
binary header instead of JSON when every entry of the frame fits
(docs/adr/0002-node-runtime.md "Frames")::

    compact = u32 0 | u32 header length | header | bodies
    header  = u8 kind (1 steps, 2 answers) | u16 count | entries
    step    = <IIIIIIIBBB id, bytes, start, end, position, T, H, dtype, flags,
              logprobs | u8 length + UTF-8 session_id | (flags & 1) sender
              | (flags & 2) capability          (each string u8-length-prefixed)
    answer  = <BIIBII tag (1 token, 2 hidden states), id, token id or bytes,
              dtype, T, H

A header length of 0 is never valid JSON, so a node that only reads JSON
refuses a compact frame as malformed. A compact header is bounded and
checked as strictly as a JSON one, every field refused alone with the JSON
form's code; a header that does not parse closes the link. ``frames``
decides which form a frame takes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from nodes_app.protocol.limits import MAX_SESSION_ID
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.wire.entries import (
    MAX_FRAME_ENTRIES,
    STEP_FIELD_NAMES,
    CancelEntry,
    ClaimEntry,
    ForwardStep,
    FrameError,
    HelloEntry,
    LinkStep,
    RefusedEntry,
    StepAnswer,
    bad_field,
    read_logprobs,
)
from nodes_app.runtime.wire.tensors import DTYPES

_COMPACT_HEAD = struct.Struct("<IIBH")  # 0, header length, kind, count
_COMPACT_STEP = struct.Struct("<IIIIIIIBBB")
_COMPACT_ANSWER = struct.Struct("<BIIBII")
COMPACT_STEPS = 1
COMPACT_ANSWERS = 2
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
_OTHER_FIELDS = tuple(name for name in STEP_FIELD_NAMES if name not in _COMPACT_FIELDS)


def _short(text: str | None) -> bytes | None:
    """``text`` as a compact string (UTF-8, at most 255 bytes); None if it does not fit."""
    if text is None:
        return b""
    raw = text.encode()
    return raw if len(raw) < 256 else None


def compact_step(entry: LinkStep | CancelEntry | HelloEntry | ClaimEntry) -> bytes | None:
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


def compact_answer(answer: StepAnswer) -> bytes | None:
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
        or answer.accepted is not None
        or answer.accepted_scores is not None
    ):
        return None
    return _COMPACT_ANSWER.pack(_ANSWER_TOKEN, answer.step_id, token, 0, 0, 0)


def compact_frame(kind: int, entries: list[bytes], bodies: Sequence[bytes]) -> bytes:
    header_length = _COMPACT_HEAD.size - 8 + sum(len(entry) for entry in entries)
    head = _COMPACT_HEAD.pack(0, header_length, kind, len(entries))
    return b"".join([head, *entries, *bodies])


def is_compact(frame: bytes) -> bool:
    return len(frame) >= 4 and frame[:4] == b"\0\0\0\0"


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
        name = "steps" if kind == COMPACT_STEPS else "answers"
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


def decode_compact_requests(frame: bytes, max_header: int | None) -> list[LinkStep | RefusedEntry]:
    count, offset, end = _compact_header(frame, COMPACT_STEPS, max_header)
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
        raise bad_field("session_id is too long")
    dtype = _CODE_DTYPES.get(code)
    if dtype is None:
        raise RuntimeRequestError(
            f"unknown dtype code {code} (one of {', '.join(DTYPES)})", code="bad_dtype"
        )
    if rows < 1 or width < 1:
        raise RuntimeRequestError("shape must be [1, T, H] with T >= 1", code="bad_shape")
    if logprobs is not None:
        read_logprobs(logprobs)
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


def decode_compact_answers(frame: bytes) -> list[StepAnswer]:
    count, offset, end = _compact_header(frame, COMPACT_ANSWERS, None)
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
