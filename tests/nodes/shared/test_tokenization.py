"""Whether a draft model's tokenizer is the model's: what each token id means in both."""

from __future__ import annotations

from nodes_app.shared.tokenization import TINY_VOCAB_SIZE, tiny_tokenizer, vocabulary_difference


def test_the_same_vocabulary_differs_in_nothing() -> None:
    assert vocabulary_difference(tiny_tokenizer(), tiny_tokenizer()) is None


def test_a_vocabulary_of_another_size_is_told_by_its_size() -> None:
    larger = tiny_tokenizer()
    larger.add_tokens(["<|draft|>"])

    assert vocabulary_difference(tiny_tokenizer(), larger) == (
        f"{TINY_VOCAB_SIZE + 1} tokens, not {TINY_VOCAB_SIZE}"
    )
