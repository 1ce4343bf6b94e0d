"""The protocol's errors: :class:`ProtocolError`, the error frame codes, what may be relayed."""

from __future__ import annotations

import re
from typing import Any

# Error frame codes. A full hop is not a broken one: the tracker waits on
# ``hop_busy`` and bans the named node on ``hop_failed``.
HOP_FAILED = "hop_failed"
HOP_BUSY = "hop_busy"
# A hop that did not answer a step within its step timeout (a kind of hop_failed).
HOP_TIMED_OUT = "hop_timeout"
# A node that could not follow the request's grammar. The tracker judged the grammar
# as the last hop uses it before routing, and a node may run another llguidance: the
# request fails, and nobody is blamed (a node saying it is banned for nothing).
BAD_GRAMMAR = "bad_grammar"

# Matched whole (``fullmatch``: ``$`` would let a trailing newline through).
_ERROR_CODE = re.compile(r"[a-z_]{1,40}")


def relayable_code(value: Any) -> str | None:
    """``value`` if it has the form of an error code (``^[a-z_]{1,40}$``), else None.

    What a node or tracker may repeat of another node's error: never its
    message (an untrusted node could put anything there), only its code.
    """
    return value if isinstance(value, str) and _ERROR_CODE.fullmatch(value) else None


class ProtocolError(ValueError):
    """Input that breaks the protocol; ``code`` is what a node's 400 would carry."""

    def __init__(self, message: str, *, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def refusal(message: str, code: str) -> ProtocolError:
    """How the node API refuses a field it reads (a ``FieldDecoder``'s ``refuse``)."""
    return ProtocolError(message, code=code)
