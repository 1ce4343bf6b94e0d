"""The tracker's signed plan: which nodes run which layers of one request, and its seal.

:class:`SignedPlan` (what the signature covers, its header form for hop
sessions) of :class:`PlanHop`; the form of a session's capability. Signing
itself is ``nodes_app.shared.signing``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any

from nodes_app.protocol.decoding import FieldDecoder, Reader, is_count, is_int, json_document
from nodes_app.protocol.errors import ProtocolError, refusal
from nodes_app.protocol.limits import MAX_PLAN_HEADER, MAX_REQUEST_ID, PLAN, PREFIX_MAX_SCOPE

# Matched whole (``fullmatch``: ``$`` would let a trailing newline through).
_HEX_SIGNATURE = re.compile(r"[0-9a-f]{128}")
_CAPABILITY = re.compile(r"[0-9a-f]{64}")
_NONCE = re.compile(r"[0-9a-f]{0,64}")


@dataclass(frozen=True)
class PlanHop:
    """One hop of the signed plan: a node and the layers it runs for this request."""

    node_id: str
    endpoint: str
    start_layer: int
    end_layer: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def parse(cls, raw: Any, index: int) -> PlanHop:
        if not isinstance(raw, dict):
            raise ProtocolError(f"plan.hops[{index}] must be an object", code="invalid_plan")
        try:
            node_id, endpoint = raw["node_id"], raw["endpoint"]
            start, end = raw["start_layer"], raw["end_layer"]
        except KeyError as missing:
            raise ProtocolError(
                f"plan.hops[{index}] lacks {missing}", code="invalid_plan"
            ) from None
        if not isinstance(node_id, str) or not node_id or not isinstance(endpoint, str):
            raise ProtocolError(
                f"plan.hops[{index}] needs a string node_id and endpoint", code="invalid_plan"
            )
        if not (is_int(start) and is_int(end)):
            raise ProtocolError(f"plan.hops[{index}] layers must be integers", code="invalid_plan")
        return cls(node_id=node_id, endpoint=endpoint.rstrip("/"), start_layer=start, end_layer=end)


def read_plan_hops(raw_hops: Any) -> tuple[PlanHop, ...]:
    """The hops of a plan: at least one, from layer 0, covering the layers contiguously."""
    if not isinstance(raw_hops, list) or not raw_hops:
        raise ProtocolError(
            "plan must be an object with a non-empty hops list", code="invalid_plan"
        )
    hops = tuple(PlanHop.parse(raw, i) for i, raw in enumerate(raw_hops))
    if hops[0].start_layer != 0:
        raise ProtocolError("hop 0 must start at layer 0", code="invalid_plan")
    for previous, hop in pairwise(hops):
        if hop.start_layer != previous.end_layer + 1 or hop.end_layer < hop.start_layer:
            raise ProtocolError(
                f"hop {hop.node_id} must start at layer {previous.end_layer + 1}: "
                "hops must cover the layers contiguously",
                code="invalid_plan",
            )
    return hops


def _model(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ProtocolError("plan.model must name the model", code="invalid_plan")
    return value


def _expires_at(value: Any) -> int:
    if not is_count(value):
        raise ProtocolError("plan.expires_at must be unix seconds", code="invalid_plan")
    return value


def _bound(name: str) -> Reader:
    """The reader of one of a plan's session bounds: a count (0: none, an unsigned plan's)."""

    def read(value: Any) -> int:
        if not is_count(value):
            raise ProtocolError(f"plan.{name} must be a non-negative integer", code="invalid_plan")
        return value

    return read


def _nonce(value: Any) -> str:
    if not isinstance(value, str) or not _NONCE.fullmatch(value):
        raise ProtocolError("plan.nonce must be at most 64 hex digits", code="invalid_plan")
    return value


def _signature(value: Any) -> str:
    if not isinstance(value, str) or (value and not _HEX_SIGNATURE.fullmatch(value)):
        raise ProtocolError("plan.signature must be 128 hex digits", code="invalid_plan")
    return value


def _prefix_scope(value: Any) -> str:
    if not isinstance(value, str) or len(value) > PREFIX_MAX_SCOPE:
        raise ProtocolError(
            f"plan.prefix_scope must be a string of at most {PREFIX_MAX_SCOPE} characters",
            code="invalid_plan",
        )
    return value


def _plan_request_id(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_REQUEST_ID:
        raise ProtocolError("plan.request_id must name the request", code="invalid_plan")
    return value


# How a plan's fields are read, wherever the plan travels (its header, the generate
# request's ``plan``); a null field is refused, an absent seal is an unsigned plan's.
PLAN_READERS: dict[str, Reader] = {
    "model": _model,
    "hops": read_plan_hops,
    "expires_at": _expires_at,
    "max_positions": _bound("max_positions"),
    "ends_at": _bound("ends_at"),
    "idle_seconds": _bound("idle_seconds"),
    "nonce": _nonce,
    "signature": _signature,
    "prefix_scope": _prefix_scope,
}


@dataclass(frozen=True)
class SignedPlan:
    """A route as the tracker signed it: which nodes run which layers of one request.

    The signature (``nodes_app.shared.signing.sign_plan``) covers :meth:`signed_fields`:
    request id, model, every hop's node id, endpoint and layers, and
    ``expires_at`` (unix seconds; after it the plan opens no session), what
    each session it opens may hold (see below) and a ``nonce``, so that two
    sends of one request (a retry, a failover on the same route) are two
    plans, each opening its own sessions. An unsigned plan has ``signature``
    "" (only ``--dev-open`` nodes take one) and no bounds (0).

    What a session of the plan may hold, on every node, is the tracker's to
    say, not the head's: ``max_positions`` (the positions it may reach: the
    tracker's count of the prompt plus ``max_tokens``, the budget of the whole
    completion, resumed tokens included), ``ends_at`` (unix seconds: the
    request is over by then, however long its steps took, so its sessions end)
    and ``idle_seconds`` (the longest its next step can be in coming while the
    tracker still waits for the request: past it the head has abandoned it).
    """

    request_id: str
    model: str
    hops: tuple[PlanHop, ...]
    expires_at: int = 0
    nonce: str = ""
    signature: str = ""
    max_positions: int = 0
    ends_at: int = 0
    idle_seconds: int = 0
    # Whose prefix cache the request's sessions may share (ADR-0027): "" (none) means
    # no node reuses or keeps anything of it across requests.
    prefix_scope: str = ""

    @property
    def bounded(self) -> bool:
        """Whether the plan says what its sessions may hold (every signed plan must)."""
        return min(self.max_positions, self.ends_at, self.idle_seconds) > 0

    def signed_fields(self) -> dict[str, Any]:
        """Exactly what the signature covers."""
        return {
            "request_id": self.request_id,
            "model": self.model,
            "hops": [hop.to_json() for hop in self.hops],
            "expires_at": self.expires_at,
            "max_positions": self.max_positions,
            "ends_at": self.ends_at,
            "idle_seconds": self.idle_seconds,
            "nonce": self.nonce,
            # Only when set: plans without one sign the bytes they always did.
            **({"prefix_scope": self.prefix_scope} if self.prefix_scope else {}),
        }

    def to_header(self) -> str:
        """The plan as the value of :data:`PLAN`: base64url of its compact JSON."""
        data = {**self.signed_fields(), "signature": self.signature}
        raw = json.dumps(data, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def from_header(cls, value: str) -> SignedPlan:
        """Parse a :data:`PLAN` header; :class:`ProtocolError` ``invalid_plan`` if malformed."""
        if len(value) > MAX_PLAN_HEADER:
            raise ProtocolError(f"{PLAN} is too long", code="invalid_plan")
        try:
            raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
            data = json_document(raw)
        except (ValueError, binascii.Error):
            raise ProtocolError(f"{PLAN} is not base64url JSON", code="invalid_plan") from None
        if not isinstance(data, dict):
            raise ProtocolError(f"{PLAN} must hold an object", code="invalid_plan")
        return cls(**_PLAN.decode(data))


_PLAN = FieldDecoder(
    SignedPlan,
    refuse=refusal,
    bad_code="invalid_plan",
    readers={**PLAN_READERS, "request_id": _plan_request_id},
    null_values=("request_id", *PLAN_READERS),
)


def capability_valid(value: str) -> bool:
    """Whether ``value`` has the form of a session capability (64 hex digits)."""
    return bool(_CAPABILITY.fullmatch(value))
