"""Server-sent events: each line gives its data or nothing, and bad JSON is refused."""

from __future__ import annotations

import pytest

from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.sse import SSE_DONE, sse_data, sse_event
from tests.support.sse import sse_frames


def test_sse_lines_give_their_data_and_skip_everything_else() -> None:
    lines = [": keep-alive", "", "event: x", 'data: {"a":1}', "data:[DONE]"]
    assert [sse_data(line) for line in lines] == [None, None, None, {"a": 1}, SSE_DONE]
    assert sse_frames(lines) == [{"a": 1}, SSE_DONE]
    assert sse_event(SSE_DONE) == b"data: [DONE]\n\n"
    with pytest.raises(ProtocolError):
        sse_data("data: {oops")
