"""A completion's token counts as the head reports them on its last frame."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodes_app.protocol.decoding import is_count
from nodes_app.protocol.errors import ProtocolError


@dataclass(frozen=True)
class Usage:
    """Token counts of a completion; the JSON form adds ``total_tokens``."""

    prompt_tokens: int
    completion_tokens: int
    # Prompt positions the head did not recompute: their state came from the prefix
    # caches of every node on the route (ADR-0027). Left out of the JSON when 0.
    cached_tokens: int = 0
    # Speculative decoding (ADR-0028): drafts the head sent through its route and
    # those the last hop accepted (each accepted one a delivered token). Left out
    # of the JSON when no draft was sent.
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    def to_json(self) -> dict[str, int]:
        out = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }
        if self.cached_tokens:
            out["cached_tokens"] = self.cached_tokens
        if self.drafted_tokens:
            out["drafted_tokens"] = self.drafted_tokens
            out["accepted_tokens"] = self.accepted_tokens
        return out

    @classmethod
    def parse(cls, raw: Any) -> Usage:
        if not isinstance(raw, dict):
            raise ProtocolError("usage must be an object")
        prompt, completion = raw.get("prompt_tokens"), raw.get("completion_tokens")
        if not (is_count(prompt) and is_count(completion)):
            raise ProtocolError("usage needs non-negative integer prompt and completion tokens")
        cached = raw.get("cached_tokens", 0)
        if not is_count(cached) or cached > prompt:
            raise ProtocolError("usage.cached_tokens must be a count of at most the prompt tokens")
        drafted, accepted = raw.get("drafted_tokens", 0), raw.get("accepted_tokens", 0)
        if not (is_count(drafted) and is_count(accepted)) or accepted > min(drafted, completion):
            raise ProtocolError(
                "usage.drafted_tokens and accepted_tokens must be counts, at most as many "
                "accepted as drafted and as completion tokens"
            )
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
            drafted_tokens=drafted,
            accepted_tokens=accepted,
        )
