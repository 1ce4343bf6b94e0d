"""Turning generated token ids into streamed text: incremental detokenisation and stop strings."""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Text deltas for a growing list of token ids, never splitting a multi-byte character.

    Decodes a short window of recent ids (so a leading-space tokenizer renders
    the same as a whole decode) and holds text back while it ends in an
    incomplete UTF-8 sequence.
    """

    def __init__(self, tokenizer: Any, initial_ids: list[int] | None = None) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = list(initial_ids or [])
        self.read_offset = len(self.ids)
        self.prefix_offset = max(0, self.read_offset - 6)

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.ids[self.prefix_offset :])
        if len(text) > len(prefix) and not text.endswith(REPLACEMENT):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return text[len(prefix) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes as U+FFFD)."""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        text = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix) :] if len(text) > len(prefix) else ""


class StopMatcher:
    """Releases text that cannot be the start of a stop string; reports when one appears."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [stop for stop in stops if stop]
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        self.pending += text
        cut = min((i for stop in self.stops if (i := self.pending.find(stop)) >= 0), default=-1)
        if cut >= 0:
            released, self.pending, self.stopped = self.pending[:cut], "", True
            return released
        hold = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(stop[:size]):
                    hold = max(hold, size)
                    break
        released = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(self.pending) - hold :]
        return released

    def flush(self) -> str:
        released, self.pending = self.pending, ""
        return "" if self.stopped else released
