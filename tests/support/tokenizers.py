"""What tests ask of a tokenizer that the product never needs."""

from __future__ import annotations

from typing import Any


def special_token_ids(tokenizer: Any) -> frozenset[int]:
    """The ids of the tokenizer's special tokens (role markers, end of text, …)."""
    return frozenset(
        int(token_id)
        for token_id, token in tokenizer.added_tokens_decoder.items()
        if getattr(token, "special", False)
    )
