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

    def to_json(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    @classmethod
    def parse(cls, raw: Any) -> Usage:
        if not isinstance(raw, dict):
            raise ProtocolError("usage must be an object")
        prompt, completion = raw.get("prompt_tokens"), raw.get("completion_tokens")
        if not (is_count(prompt) and is_count(completion)):
            raise ProtocolError("usage needs non-negative integer prompt and completion tokens")
        return cls(prompt_tokens=prompt, completion_tokens=completion)
