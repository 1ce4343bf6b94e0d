"""The signed plan's credentials: a session capability has exactly its form."""

from __future__ import annotations

from nodes_app.protocol.signed_plan import capability_valid


def test_a_capability_with_a_trailing_newline_is_not_taken_for_one() -> None:
    assert capability_valid("a" * 64)
    assert not capability_valid("a" * 64 + "\n")
