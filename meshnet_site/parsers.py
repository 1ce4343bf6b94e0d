"""The request body parsers of the tracker's API (DRF's ``DEFAULT_PARSER_CLASSES``)."""

from __future__ import annotations

from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser; JSON nested deeper than the decoder goes is a 400 like any
    malformed body (DRF's own lets the ``RecursionError`` through: a 500)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None
