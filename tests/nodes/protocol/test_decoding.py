"""Reading JSON into a declared shape: each field by its reader or its type, or its default."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from nodes_app.protocol.decoding import FieldDecoder
from nodes_app.protocol.errors import ProtocolError, refusal


@dataclass(frozen=True)
class Shape:
    name: str
    count: int
    ids: tuple[int, ...] | None
    flag: bool = False
    note: str | None = None


DECODER = FieldDecoder(
    Shape,
    refuse=refusal,
    bad_code="bad_field",
    readers={"note": lambda value: str(value).upper()},
    max_string=8,
    missing="the shape lacks {name}",
    unknown="unknown fields: {names}",
)


def refused(raw: dict[str, Any]) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        DECODER.decode(raw)
    return caught.value


def test_fields_are_read_by_their_type_and_their_reader() -> None:
    values = DECODER.decode({"name": "a", "count": 2, "ids": [1, 2], "flag": True, "note": "x"})

    assert Shape(**values) == Shape("a", 2, (1, 2), True, "X")


def test_absent_and_null_fields_take_their_default_or_none() -> None:
    values = DECODER.decode({"name": "a", "count": 0, "flag": None})

    assert Shape(**values) == Shape("a", 0, None)


@pytest.mark.parametrize(
    ("raw", "code", "words"),
    [
        ({"count": 1}, "missing_field", "the shape lacks name"),
        ({"name": "a", "count": 1, "extra": 1, "other": 2}, "bad_field", "extra, other"),
        ({"name": "a", "count": True}, "bad_field", "count has the wrong type"),
        ({"name": "a", "count": -1}, "bad_field", "count must not be negative"),
        ({"name": "a" * 9, "count": 1}, "bad_field", "name is too long"),
        ({"name": "a", "count": 1, "ids": [1, -1]}, "bad_field", "ids must be a list of token"),
        ({"name": "a", "count": 1, "flag": 1}, "bad_field", "flag has the wrong type"),
    ],
)
def test_a_bad_field_is_refused_by_name(raw: dict[str, Any], code: str, words: str) -> None:
    error = refused(raw)

    assert error.code == code
    assert words in error.message
