"""Incremental detokenisation and stop strings, with the tiny model's byte-level tokenizer."""

from __future__ import annotations

import pytest

from nodes_app.runtime.text import IncrementalDetokenizer, StopMatcher
from nodes_app.runtime.tiny import tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return tiny_tokenizer()


def test_multi_byte_characters_arrive_whole(tokenizer) -> None:  # type: ignore[no-untyped-def]
    text = "héllo 世界 🎉!"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode())  # one token per byte
    detokenizer = IncrementalDetokenizer(tokenizer)
    deltas = [detokenizer.push(token) for token in ids] + [detokenizer.flush()]
    assert "".join(deltas) == text
    assert all("\ufffd" not in delta for delta in deltas)
    assert "🎉" in deltas


def test_resumed_ids_are_not_streamed_again(tokenizer) -> None:  # type: ignore[no-untyped-def]
    earlier = tokenizer("ab", add_special_tokens=False)["input_ids"]
    later = tokenizer("cd", add_special_tokens=False)["input_ids"]
    detokenizer = IncrementalDetokenizer(tokenizer, earlier)
    assert "".join(detokenizer.push(t) for t in later) + detokenizer.flush() == "cd"


def test_special_tokens_do_not_show_in_the_text(tokenizer) -> None:  # type: ignore[no-untyped-def]
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
