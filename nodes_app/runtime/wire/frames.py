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
(see ``engine.trust``; the plan only on a session's opening step). A cancel entry
is ``{"id", "cancel": session_id, "capability"?}``. A head opens every link
with a frame of one *hello* entry, ``{"id", "hello": session_id,
"capability"?, "plan"?}`` (the credentials of the first step it will send),
answered ``{"id", "status": 204}`` or refused, and sends nothing else until
then: the hop reads small frames only until a link has shown them
(``hop.link_guard``). A cancel may carry ``"keep": [hash, ...]`` (keep the
session's state in the prefix cache under that chain), and a *claim*,
``{"id", "claim": session_id, "start", "end", "reserve", "hashes": [hash,
...], "capability"?, "plan"?}``, opens a session and asks how many leading
blocks of the chain the hop holds (ADR-0027). An answer is ``{"id",
"bytes", "dtype", "shape"}`` (hidden states), ``{"id", "token_id",
"logprob"?, "top"?, "prompt"?, "bytes"?, "accepted"?, "accepted_scores"?}``
(the hop ending at the last layer: the chosen token, its logprob and ``[[id,
logprob], ...]`` best alternatives when the step asked for ``logprobs``, for
an echo ``"prompt": [rows, k]`` with a body of its prompt scores,
:class:`PromptTable`, and for a draft round the drafts accepted before the
token when any, with ``logprobs`` each one's ``[logprob, [[id, logprob],
...]]``), ``{"id", "status": 204}`` (a cancel done), ``{"id", "blocks",
"exact"}`` (a claim's) or ``{"id", "status", "code", "type", "message"}``
(refused or failed; a head relays only the code,
``protocol.errors.relayable_code``, and logs the rest).

A frame carries as many entries as were ready together, so a batch of
steps stays a batch along the route. The one JSON header per frame is a few
hundred bytes; tensors never pass through JSON. The :class:`ForwardStep`
fields travel generically: by name, read as the protocol reads any declared
shape (``nodes_app.protocol.decoding.FieldDecoder``), so a field added to it
needs no change here.

A decode step's frame and a last hop's token answers are on every token's
path, so they may also travel *compact*: the same entries under a binary
header instead of JSON (encoding and decoding a one-step frame and its
answer: ~30 µs with JSON headers, ~13 µs compact), when every entry of the
frame fits it (a step whose other fields are all None: no plan, sampling,
reserve or id lists; a token answer without scores; hidden states of shape
``[1, T, H]``); anything else, openings, cancels, hellos and refusals, goes
as JSON. The compact layout and its checks are ``compact``'s.

This module is the JSON form and the choice between the forms; the compact
form is ``compact``'s, the entries ``entries``', tensor bytes ``tensors``'.
What the head requires of an answer before it uses it (the token in the
vocabulary, the scores asked for, finite hidden states) is
``head.hop_answers``'.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

from nodes_app.protocol.decoding import is_count, json_document
from nodes_app.protocol.limits import MAX_SESSION_ID
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.wire.compact import (
    COMPACT_ANSWERS,
    COMPACT_STEPS,
    compact_answer,
    compact_frame,
    compact_step,
    decode_compact_answers,
    decode_compact_requests,
    is_compact,
)
from nodes_app.runtime.wire.entries import (
    MAX_FRAME_ENTRIES,
    CancelEntry,
    ClaimEntry,
    FrameError,
    HelloEntry,
    LinkStep,
    RefusedEntry,
    StepAnswer,
    bad_field,
    read_block_hashes,
    step_fields,
    step_from_fields,
)

_LENGTH = struct.Struct("<I")
# Longest credential strings accepted (a capability is 64 hex digits; a plan is
# bounded again, more tightly, when it is parsed).
_MAX_CREDENTIAL = 16384


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


# --- head → hop ------------------------------------------------------------------------


def encode_requests(entries: Sequence[LinkStep | CancelEntry | HelloEntry | ClaimEntry]) -> bytes:
    """One frame of steps, cancels, claims and hellos, in order: compact when every entry fits."""
    compact = [item for item in map(compact_step, entries) if item is not None]
    if len(compact) == len(entries):
        steps = [entry.body for entry in entries if isinstance(entry, LinkStep)]
        return compact_frame(COMPACT_STEPS, compact, steps)
    header: list[dict[str, Any]] = []
    bodies: list[bytes] = []
    for entry in entries:
        if isinstance(entry, CancelEntry):
            item: dict[str, Any] = {"id": entry.step_id, "cancel": entry.session_id}
            if entry.keep is not None:
                item["keep"] = list(entry.keep)
        elif isinstance(entry, ClaimEntry):
            item = {
                "id": entry.step_id,
                "claim": entry.session_id,
                "start": entry.start,
                "end": entry.end,
                "reserve": entry.reserve,
                "hashes": list(entry.hashes),
            }
            if entry.plan is not None:
                item["plan"] = entry.plan
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
) -> list[LinkStep | CancelEntry | HelloEntry | ClaimEntry | RefusedEntry]:
    """The entries of a head's frame; FrameError if the frame itself is malformed (or its
    header is over ``max_header`` bytes: ``protocol.limits.link_header_limit``).

    A step whose fields are malformed (a missing field, a bad shape, dtype or
    sampling) comes back as a :class:`RefusedEntry` with its 400, so that it
    fails alone.
    """
    if is_compact(frame):
        return list(decode_compact_requests(frame, max_header))
    entries, rest = _unframe(frame, "steps", max_header)
    decoded: list[LinkStep | CancelEntry | HelloEntry | ClaimEntry | RefusedEntry] = []
    for entry, body in _split(entries, rest):
        step_id = entry["id"]
        try:
            capability = _credential(entry, "capability")
            for kind in ("cancel", "hello", "claim"):
                if kind not in entry:
                    continue
                session_id = entry[kind]
                if not isinstance(session_id, str) or len(session_id) > MAX_SESSION_ID:
                    raise bad_field(f"{kind} must name a session id")
                if kind == "cancel":
                    keep = entry.get("keep")
                    kept = None if keep is None else read_block_hashes(keep, "keep")
                    decoded.append(CancelEntry(step_id, session_id, capability, kept))
                elif kind == "claim":
                    decoded.append(_claim(entry, step_id, session_id, capability))
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


def _claim(
    entry: dict[str, Any], step_id: int, session_id: str, capability: str | None
) -> ClaimEntry:
    """A claim's fields, checked (a 400 ``bad_field`` naming the first bad one)."""
    numbers: dict[str, int] = {}
    for name in ("start", "end", "reserve"):
        value = entry.get(name)
        if not is_count(value):
            raise bad_field(f"a claim's {name} must be a non-negative integer")
        numbers[name] = value
    if numbers["start"] > numbers["end"]:
        raise bad_field("a claim's start must not pass its end")
    hashes = read_block_hashes(entry.get("hashes"), "hashes")
    plan = _credential(entry, "plan")
    return ClaimEntry(
        step_id,
        session_id,
        numbers["start"],
        numbers["end"],
        numbers["reserve"],
        hashes,
        capability,
        plan,
    )


def _credential(entry: dict[str, Any], name: str) -> str | None:
    value = entry.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > _MAX_CREDENTIAL:
        raise bad_field(f"{name} must be a string")
    return value


# --- hop → head ------------------------------------------------------------------------


def encode_answers(answers: Sequence[StepAnswer]) -> bytes:
    """One frame of answers, in order: compact when every answer fits."""
    compact = [item for item in map(compact_answer, answers) if item is not None]
    if len(compact) == len(answers):
        hidden = [answer.hidden for answer in answers if answer.hidden is not None]
        return compact_frame(COMPACT_ANSWERS, compact, hidden)
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
        elif answer.blocks is not None:
            item.update(blocks=answer.blocks, exact=bool(answer.exact))
        else:
            item["token_id"] = answer.token_id
            scores = {
                "logprob": answer.logprob,
                "top": answer.top,
                "prompt": answer.prompt,
                "accepted": answer.accepted,
                "accepted_scores": answer.accepted_scores,
            }
            item.update((key, value) for key, value in scores.items() if value is not None)
            if answer.prompt_body is not None:
                item["bytes"] = len(answer.prompt_body)
                bodies.append(answer.prompt_body)
        header.append(item)
    return _frame({"answers": header}, bodies)


def decode_answers(frame: bytes) -> list[StepAnswer]:
    """The answers of a hop's frame, as sent (the head checks each); FrameError if malformed."""
    if is_compact(frame):
        return decode_compact_answers(frame)
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
                blocks=entry.get("blocks"),
                exact=entry.get("exact"),
                accepted=entry.get("accepted"),
                accepted_scores=entry.get("accepted_scores"),
                code=entry.get("code") if isinstance(entry.get("code"), str) else None,
                error_type=entry.get("type") if isinstance(entry.get("type"), str) else None,
                message=str(entry.get("message") or "")[:300],
            )
        )
    return answers
