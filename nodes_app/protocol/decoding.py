"""Reading JSON into a declared shape: the one way the node API and hop frames check input.

Every JSON document from outside is parsed by :func:`json_document`: JSON
nested deeper than the decoder goes is malformed JSON like any other (a
``ValueError``), never a ``RecursionError`` that escapes a handler.

A shape is declared once, as a frozen dataclass. :class:`FieldDecoder` reads
a decoded JSON object into that dataclass's fields, each by the reader the
boundary declares for it (a function of the raw value that returns the
checked value or raises), or else by the reader its type hint gives:

- ``int``: a non-negative integer, never a bool;
- ``str``: a string, of at most ``max_string`` characters when a bound is set;
- ``bool``, ``float`` (an integer is taken as a number too);
- ``tuple[int, ...]`` / ``list[int]``: a list of token ids.

A field that is absent (or null, unless null is a value it may take) takes its
default, None where its hint allows None; a field without either is missing.
Each boundary says how it refuses, ``refuse(message, code)``: the generate
request's :class:`~nodes_app.protocol.errors.ProtocolError`, a hop step's
``RuntimeRequestError``; the messages name the field.

The decoder is built once per shape (hints resolved, a reader chosen per
field), so reading one object is one pass over its fields: hop steps are
read per step per hop.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeGuard

Reader = Callable[[Any], Any]
Refuse = Callable[[str, str], Exception]


def json_document(raw: str | bytes | bytearray, **options: Any) -> Any:
    """``json.loads(raw, **options)``; raises ``ValueError`` for malformed JSON, JSON
    nested past the decoder's depth (about a thousand levels) included."""
    try:
        return json.loads(raw, **options)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def is_int(value: Any) -> TypeGuard[int]:
    """An integer that is not a bool (JSON's true is not 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_count(value: Any) -> TypeGuard[int]:
    """A non-negative integer (a token id, a token count)."""
    return is_int(value) and value >= 0


# What an absent field falls back to: the dataclass default, or nothing (missing).
_ABSENT = object()
_MISSING = object()


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    reader: Reader
    # What an absent field becomes: _ABSENT leaves it to the dataclass default.
    fallback: Any
    # Whether null is read as a value (else it counts as absent).
    null_is_value: bool


class FieldDecoder:
    """Reads JSON objects into the fields of ``shape`` (see the module docstring).

    ``readers`` declare the fields whose check is more than their hint says.
    ``bad_code`` is the code of a refusal by a hint's reader. ``missing``, a
    message with ``{name}``, refuses a field that is absent and has no
    default; without it the field's reader is given None (and names the field
    itself). ``unknown``, a message with ``{names}``, refuses keys that are
    not fields; without it they are ignored. ``null_values`` names the fields
    whose null is read as a value (by their reader); any other null is absent.
    """

    def __init__(
        self,
        shape: type,
        *,
        refuse: Refuse,
        bad_code: str,
        readers: Mapping[str, Reader] | None = None,
        max_string: int | None = None,
        missing: str | None = None,
        unknown: str | None = None,
        null_values: Collection[str] = (),
    ) -> None:
        self._refuse = refuse
        self._bad_code = bad_code
        self._max_string = max_string
        self._missing = missing
        self._unknown = unknown
        hints = typing.get_type_hints(shape)
        declared: dict[str, Reader] = dict(readers or {})
        self._fields: tuple[_Field, ...] = tuple(
            _Field(
                name=spec.name,
                reader=(
                    declared.pop(spec.name)
                    if spec.name in declared
                    else self._hint_reader(spec.name, hints)
                ),
                fallback=self._fallback(spec, hints[spec.name]),
                null_is_value=spec.name in null_values,
            )
            for spec in dataclasses.fields(shape)
        )
        if declared:
            raise TypeError(f"readers for fields {shape.__name__} lacks: {sorted(declared)}")
        self._names = frozenset(spec.name for spec in self._fields)

    def decode(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """The checked fields of ``raw`` (those left to their dataclass default left out)."""
        if self._unknown is not None and not self._names.issuperset(raw):
            unknown = ", ".join(sorted(set(raw) - self._names))
            raise self._refuse(self._unknown.format(names=unknown), self._bad_code)
        values: dict[str, Any] = {}
        for spec in self._fields:
            value = raw.get(spec.name, _ABSENT)
            if value is _ABSENT or (value is None and not spec.null_is_value):
                fallback = spec.fallback
                if fallback is _ABSENT:
                    continue
                if fallback is not _MISSING:
                    values[spec.name] = fallback
                    continue
                if self._missing is not None:
                    raise self._refuse(self._missing.format(name=spec.name), "missing_field")
                value = None
            values[spec.name] = spec.reader(value)
        return values

    @staticmethod
    def _fallback(spec: dataclasses.Field[Any], hint: Any) -> Any:
        if (
            spec.default is not dataclasses.MISSING
            or spec.default_factory is not dataclasses.MISSING
        ):
            return _ABSENT
        if isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint):
            return None
        return _MISSING

    def _hint_reader(self, name: str, hints: Mapping[str, Any]) -> Reader:
        hint = hints[name]
        allowed = tuple(
            arg for arg in (typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,))
            if arg is not type(None)
        )  # fmt: skip
        if len(allowed) == 1 and typing.get_origin(allowed[0]) in (tuple, list):
            return self._token_ids_reader(name, typing.get_origin(allowed[0]))
        if float in allowed:
            allowed = (*allowed, int)
        refuse, code, max_string = self._refuse, self._bad_code, self._max_string

        def read(value: Any) -> Any:
            if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
                raise refuse(f"{name} has the wrong type", code)
            if is_int(value) and value < 0:
                raise refuse(f"{name} must not be negative", code)
            if max_string is not None and isinstance(value, str) and len(value) > max_string:
                raise refuse(f"{name} is too long", code)
            return value

        return read

    def _token_ids_reader(self, name: str, kind: type) -> Reader:
        refuse, code = self._refuse, self._bad_code

        def read(value: Any) -> Any:
            if not isinstance(value, list) or not all(is_count(token) for token in value):
                raise refuse(f"{name} must be a list of token ids", code)
            return kind(value)

        return read
