"""Token logprobs in OpenAI's shape: each token's entry and its best alternatives."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from nodes_app.protocol.decoding import is_int
from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.limits import TOP_LOGPROBS_MAX


@dataclass(frozen=True)
class TopLogprob:
    """One alternative at a position: its token, its logprob and its UTF-8 bytes."""

    token: str
    logprob: float
    utf8: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return _entry_json(self.token, self.logprob, self.utf8)

    @classmethod
    def parse(cls, raw: Any) -> TopLogprob:
        token, utf8 = _token_of(raw)
        logprob = raw.get("logprob")
        if not logprob_valid(logprob):
            raise ProtocolError("a logprob must be a finite number of at most 0")
        return cls(token, float(logprob), utf8)


@dataclass(frozen=True)
class TokenLogprob:
    """One token's entry in OpenAI's logprobs shape: token, logprob, bytes, top_logprobs.

    How a head writes a token (``nodes_app.runtime.head.text.TokenPieces``):
    ``bytes`` are the token's own UTF-8 bytes — a byte-level BPE piece may hold
    only part of a character — and ``token`` is those bytes decoded with
    ``errors="replace"`` (a partial character shows as U+FFFD). A special
    token (end of turn, role markers: what the text leaves out) has no bytes
    and its written form as ``token`` (``"<|im_end|>"``). So the concatenated
    ``bytes`` of a completion's entries are the UTF-8 of its text, up to
    where a stop string cut it (decoded with ``errors="replace"`` if the
    model produced bytes that are not UTF-8, as the text is; for byte-level
    tokenizers, as the shipped models use: a SentencePiece tokenizer writes a
    word's leading space as a space, which its decoder drops at the start).
    ``logprob`` is None only for a prompt's first token (nothing precedes
    it), whose ``top_logprobs`` is then empty; ``top_logprobs`` holds the
    best alternatives at the position, best first (the chosen token may be
    among them).
    """

    token: str
    logprob: float | None
    utf8: tuple[int, ...]
    top_logprobs: tuple[TopLogprob, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            **_entry_json(self.token, self.logprob, self.utf8),
            "top_logprobs": [top.to_json() for top in self.top_logprobs],
        }

    @classmethod
    def parse(cls, raw: Any, *, first_of_prompt: bool = False) -> TokenLogprob:
        """An entry from JSON; only a prompt's first entry has (and must have) a null logprob."""
        token, utf8 = _token_of(raw)
        logprob, tops = raw.get("logprob"), raw.get("top_logprobs")
        if not isinstance(tops, list) or len(tops) > TOP_LOGPROBS_MAX:
            raise ProtocolError(
                f"top_logprobs must be a list of at most {TOP_LOGPROBS_MAX} alternatives"
            )
        if first_of_prompt:
            if logprob is not None or tops:
                raise ProtocolError("a prompt's first token has a null logprob and no alternatives")
            return cls(token, None, utf8)
        if not logprob_valid(logprob):
            raise ProtocolError("a logprob must be a finite number of at most 0")
        return cls(token, float(logprob), utf8, tuple(TopLogprob.parse(top) for top in tops))


def _entry_json(token: str, logprob: float | None, utf8: tuple[int, ...]) -> dict[str, Any]:
    """The fields a token's entry and an alternative share."""
    return {"token": token, "logprob": logprob, "bytes": list(utf8)}


def _token_of(raw: Any) -> tuple[str, tuple[int, ...]]:
    if not isinstance(raw, dict):
        raise ProtocolError("a logprob entry must be an object")
    token, utf8 = raw.get("token"), raw.get("bytes")
    if not isinstance(token, str):
        raise ProtocolError("a logprob entry's token must be a string")
    if not isinstance(utf8, list) or not all(is_int(b) and 0 <= b <= 255 for b in utf8):
        raise ProtocolError("a logprob entry's bytes must be a list of byte values")
    return token, tuple(utf8)


def logprob_valid(value: Any) -> bool:
    """Whether ``value`` can be a logprob: a finite number of at most 0 (not a bool)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value <= 0
    )
