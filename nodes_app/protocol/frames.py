"""The head's frames: the chunks and errors of its SSE stream, encoded and parsed."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from nodes_app.protocol.decoding import is_count
from nodes_app.protocol.errors import HOP_BUSY, HOP_FAILED, ProtocolError
from nodes_app.protocol.logprobs import TokenLogprob
from nodes_app.protocol.sse import sse_event
from nodes_app.protocol.usage import Usage


def completion_chunk(
    *,
    completion_id: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    logprobs: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """OpenAI's ``chat.completion.chunk``: the head's frames and the tracker's client
    chunks share this one shape; ``logprobs`` (entries, see :class:`TokenLogprob`)
    becomes the choice's ``logprobs.content``; ``extra`` adds top-level fields
    (usage, meshnet…)."""
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    if logprobs is not None:
        choice["logprobs"] = {"content": logprobs}
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
        **extra,
    }


@dataclass(frozen=True)
class ChunkFrame:
    """One chunk of the head's stream.

    ``token_ids`` are the ids whose text this chunk completes (text is held
    back while it could still be an incomplete character or the start of a
    stop string). The first frame has ``role``; the last has
    ``finish_reason`` (``stop`` or ``length``) and ``usage``, whose
    ``completion_tokens`` counts resumed and new tokens.

    With the request's ``logprobs``, ``logprobs`` holds one entry per token
    id, in order (JSON: ``choices[0].logprobs.content``). With ``echo``, the
    first frame holds ``prompt_token_ids`` and ``prompt_logprobs``, one entry
    per prompt token (JSON: top-level ``meshnet_prompt_token_ids`` and
    ``meshnet_prompt_logprobs``).
    """

    content: str = ""
    token_ids: tuple[int, ...] = ()
    role: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_token_ids: tuple[int, ...] | None = None
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None

    def to_json(self, *, completion_id: str, created: int, model: str) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if self.role is not None:
            delta["role"] = self.role
        if self.content or self.role is not None:
            delta["content"] = self.content
        extra: dict[str, Any] = {}
        if self.token_ids:
            extra["meshnet_token_ids"] = list(self.token_ids)
        if self.prompt_token_ids is not None and self.prompt_logprobs is not None:
            extra["meshnet_prompt_token_ids"] = list(self.prompt_token_ids)
            extra["meshnet_prompt_logprobs"] = [entry.to_json() for entry in self.prompt_logprobs]
        if self.usage is not None:
            extra["usage"] = self.usage.to_json()
        return completion_chunk(
            completion_id=completion_id,
            created=created,
            model=model,
            delta=delta,
            finish_reason=self.finish_reason,
            logprobs=[entry.to_json() for entry in self.logprobs] if self.logprobs else None,
            **extra,
        )

    def event(self, *, completion_id: str, created: int, model: str) -> bytes:
        """This frame as a head streams it: one SSE event of :meth:`to_json`.

        An echo's prompt entries (up to :data:`ECHO_MAX_SCORES` values) are
        written to JSON one by one: a worker thread writing a large echo then
        lets the event loop run between entries, where one ``json.dumps`` of
        the whole frame would hold the GIL throughout.
        """
        if not self.prompt_logprobs:
            return sse_event(
                self.to_json(completion_id=completion_id, created=created, model=model)
            )
        payload = replace(self, prompt_logprobs=()).to_json(
            completion_id=completion_id, created=created, model=model
        )
        del payload["meshnet_prompt_logprobs"]
        head = json.dumps(payload, separators=(",", ":"))
        entries = ",".join(
            json.dumps(entry.to_json(), separators=(",", ":")) for entry in self.prompt_logprobs
        )
        return sse_event(f'{head[:-1]},"meshnet_prompt_logprobs":[{entries}]}}')


@dataclass(frozen=True)
class ErrorFrame:
    """The head's last frame when a downstream hop failed (or was full: :data:`HOP_BUSY`).

    ``node_id`` names the hop to blame; a tracker trusts it only for a node
    of the route it sent.
    """

    message: str
    code: str = HOP_FAILED
    node_id: str | None = None
    type: str = "upstream_error"

    @property
    def busy(self) -> bool:
        return self.code == HOP_BUSY

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"message": self.message, "type": self.type, "code": self.code}
        if self.node_id is not None:
            error["node_id"] = self.node_id
        return {"error": error}


def parse_frame(payload: Any) -> ChunkFrame | ErrorFrame:
    """A head frame from its decoded JSON; :class:`ProtocolError` if it is malformed.

    A chunk's logprobs, when present, must hold exactly one entry per token
    id; prompt logprobs come with the prompt's token ids, one entry each.
    """
    if not isinstance(payload, dict):
        raise ProtocolError("a frame must be a JSON object")
    if "error" in payload:
        error = payload["error"]
        if not isinstance(error, dict):
            raise ProtocolError("an error frame's error must be an object")
        node_id = error.get("node_id")
        return ErrorFrame(
            message=str(error.get("message") or "hop failed"),
            code=str(error.get("code") or HOP_FAILED),
            node_id=None if node_id is None else str(node_id),
            type=str(error.get("type") or "upstream_error"),
        )
    choices = payload.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise ProtocolError("a chunk has exactly one choice")
    choice = choices[0]
    delta = choice.get("delta") or {}
    if not isinstance(delta, dict):
        raise ProtocolError("a chunk's delta must be an object")
    content, role, finish = (
        delta.get("content") or "",
        delta.get("role"),
        choice.get("finish_reason"),
    )
    if not isinstance(content, str) or not isinstance(role, str | None):
        raise ProtocolError("a chunk's delta has a string content and role")
    if not isinstance(finish, str | None):
        raise ProtocolError("finish_reason must be a string")
    token_ids = _token_ids(payload.get("meshnet_token_ids", []), "meshnet_token_ids")
    usage = payload.get("usage")
    prompt_ids, prompt_logprobs = _prompt_logprobs(payload)
    return ChunkFrame(
        content=content,
        token_ids=token_ids,
        role=role,
        finish_reason=finish or None,
        usage=None if usage is None else Usage.parse(usage),
        logprobs=_content_logprobs(choice.get("logprobs"), len(token_ids)),
        prompt_token_ids=prompt_ids,
        prompt_logprobs=prompt_logprobs,
    )


def _token_ids(raw: Any, name: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(is_count(t) for t in raw):
        raise ProtocolError(f"{name} must be a list of token ids")
    return tuple(raw)


def _content_logprobs(raw: Any, tokens: int) -> tuple[TokenLogprob, ...]:
    """A chunk's ``logprobs`` (None or ``{"content": [entry per token id]}``)."""
    if raw is None:
        return ()
    content = raw.get("content") if isinstance(raw, dict) else None
    if not isinstance(content, list) or len(content) != tokens:
        raise ProtocolError("a chunk's logprobs.content must hold one entry per token id")
    return tuple(TokenLogprob.parse(entry) for entry in content)


def _prompt_logprobs(
    payload: dict[str, Any],
) -> tuple[tuple[int, ...] | None, tuple[TokenLogprob, ...] | None]:
    """An echo's prompt token ids and their entries (the first with a null logprob), or Nones."""
    raw_ids, raw_entries = (
        payload.get("meshnet_prompt_token_ids"),
        payload.get("meshnet_prompt_logprobs"),
    )
    if raw_ids is None and raw_entries is None:
        return None, None
    ids = _token_ids(raw_ids, "meshnet_prompt_token_ids")
    if not isinstance(raw_entries, list) or len(raw_entries) != len(ids):
        raise ProtocolError("meshnet_prompt_logprobs must hold one entry per prompt token")
    entries = tuple(
        TokenLogprob.parse(entry, first_of_prompt=index == 0)
        for index, entry in enumerate(raw_entries)
    )
    return ids, entries
