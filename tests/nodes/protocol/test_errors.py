"""What a node may relay of another's error: its code, when it has the form of one."""

from __future__ import annotations

from nodes_app.protocol.errors import relayable_code


def test_a_code_with_a_trailing_newline_is_not_taken_for_one() -> None:
    assert relayable_code("hop_failed") == "hop_failed"
    assert relayable_code("hop_failed\n") is None
