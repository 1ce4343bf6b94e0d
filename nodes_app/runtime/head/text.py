"""Turning token ids into text: incremental detokenisation, stop strings, each token's bytes."""

from __future__ import annotations

import functools
import re
from typing import Any

from tokenizers import decoders

from nodes_app.shared.tokenization import byte_level_alphabet

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


class TokenPieces:
    """Each token id as a logprob entry writes it (``protocol.logprobs.TokenLogprob``).

    Each is ``(token, bytes)``.

    A byte-level BPE tokenizer (GPT-2's ByteLevel decoder: the shipped
    models, Llama 3, Qwen) stores each token as the printable stand-ins of
    its bytes, which are mapped back; a SentencePiece piece is read as text
    with ``▁`` for a space and ``<0xNN>`` for a raw byte. An added token is
    its own content, and a special one (what decoding leaves out of the
    text) has no bytes. ``token`` is the bytes decoded with
    ``errors="replace"`` — except a special token's, which is written out.
    Computed once per id, on first use.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.byte_level = isinstance(getattr(backend, "decoder", None), decoders.ByteLevel)
        self.alphabet = {char: byte for byte, char in byte_level_alphabet().items()}
        self.added = {
            int(token_id): (str(token.content), bool(getattr(token, "special", False)))
            for token_id, token in tokenizer.added_tokens_decoder.items()
        }
        self._pieces: dict[int, tuple[str, bytes]] = {}

    def __call__(self, token_id: int) -> tuple[str, bytes]:
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self._piece(token_id)
        return piece

    def _piece(self, token_id: int) -> tuple[str, bytes]:
        if token_id in self.added:
            content, special = self.added[token_id]
            return content, b"" if special else content.encode()
        written = self.tokenizer.convert_ids_to_tokens(token_id)
        if not isinstance(written, str):  # an id past the tokenizer (padded LM head rows)
            return "", b""
        if self.byte_level and all(char in self.alphabet for char in written):
            raw = bytes(self.alphabet[char] for char in written)
        elif _BYTE_PIECE.fullmatch(written):
            raw = bytes([int(written[3:5], 16)])
        else:
            raw = written.replace(_SENTENCEPIECE_SPACE, " ").encode()
        return raw.decode("utf-8", errors="replace"), raw


_SENTENCEPIECE_SPACE = "\u2581"
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


@functools.lru_cache(maxsize=4)
def token_pieces(tokenizer: Any) -> TokenPieces:
    """``tokenizer``'s :class:`TokenPieces`, built at first use and then kept.

    A node serves one tokenizer, so its pieces are computed once per id for
    the life of the process, whichever generation asks first.
    """
    return TokenPieces(tokenizer)
