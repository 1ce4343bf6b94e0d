"""The head's input: a ``/v1/generate`` body with its route plan, validated."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from nodes_app.runtime.errors import RuntimeRequestError
from nodes_app.runtime.sampling import SamplingParams

MAX_STOPS = 8
MAX_STOP_LENGTH = 256


@dataclass(frozen=True)
class Hop:
    node_id: str
    endpoint: str
    start_layer: int
    end_layer: int


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    messages: list[dict[str, str]]
    max_tokens: int
    sampling: SamplingParams
    stop: list[str]
    resume_token_ids: list[int]
    model: str
    hops: list[Hop]


@dataclass(frozen=True)
class HeadIdentity:
    """What the head checks hop 0 against."""

    node_id: str
    model_key: str
    shard_start: int
    shard_end: int
    num_layers: int
    vocab_size: int


def _fail(message: str, code: str = "invalid_request") -> RuntimeRequestError:
    return RuntimeRequestError(message, code=code)


def _int(body: dict[str, Any], name: str, default: int | None = None) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(f"{name} must be an integer")
    return value


def _hop(raw: Any, index: int) -> Hop:
    if not isinstance(raw, dict):
        raise _fail(f"plan.hops[{index}] must be an object", "invalid_plan")
    try:
        hop = Hop(
            node_id=str(raw["node_id"]),
            endpoint=str(raw["endpoint"]).rstrip("/"),
            start_layer=raw["start_layer"],
            end_layer=raw["end_layer"],
        )
    except KeyError as missing:
        raise _fail(f"plan.hops[{index}] lacks {missing}", "invalid_plan") from None
    if not all(
        isinstance(v, int) and not isinstance(v, bool) for v in (hop.start_layer, hop.end_layer)
    ):
        raise _fail(f"plan.hops[{index}] layers must be integers", "invalid_plan")
    return hop


def parse_generate_request(body: Any, head: HeadIdentity) -> GenerateRequest:
    """Validate ``body``; raises :class:`RuntimeRequestError` (400) on anything wrong."""
    if not isinstance(body, dict):
        raise _fail("body must be a JSON object")
    request_id = body.get("request_id")
    if not isinstance(request_id, str) or not request_id or len(request_id) > 100:
        raise _fail("request_id must be a non-empty string of at most 100 characters")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _fail("messages must be a non-empty list")
    for message in messages:
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise _fail("each message needs a string role and a string content")
    max_tokens = _int(body, "max_tokens", 256)
    if max_tokens < 1:
        raise _fail("max_tokens must be at least 1")
    sampling = SamplingParams.from_mapping(
        {key: body[key] for key in ("temperature", "top_p", "top_k", "seed") if key in body}
    )
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if (
        not isinstance(stop, list)
        or len(stop) > MAX_STOPS
        or not all(isinstance(s, str) and len(s) <= MAX_STOP_LENGTH for s in stop)
    ):
        raise _fail(
            f"stop must be a string or a list of at most {MAX_STOPS} strings "
            f"of at most {MAX_STOP_LENGTH} characters"
        )
    resume = body.get("resume_token_ids") or []
    if not isinstance(resume, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < head.vocab_size for t in resume
    ):
        raise _fail("resume_token_ids must be a list of token ids")
    plan = body.get("plan")
    if not isinstance(plan, dict) or not isinstance(plan.get("hops"), list) or not plan["hops"]:
        raise _fail("plan must be an object with a non-empty hops list", "invalid_plan")
    if plan.get("model", head.model_key) != head.model_key:
        raise _fail(f"this node serves {head.model_key}, not {plan.get('model')}", "wrong_model")
    hops = [_hop(raw, i) for i, raw in enumerate(plan["hops"])]
    first = hops[0]
    if first.node_id != head.node_id:
        raise _fail(f"plan hop 0 is {first.node_id}, not this node ({head.node_id})", "not_head")
    if first.start_layer != 0 or first.end_layer > head.shard_end:
        raise _fail(
            f"hop 0 must run layers 0..e with e <= {head.shard_end} on this node", "invalid_plan"
        )
    for previous, hop in pairwise(hops):
        if hop.start_layer != previous.end_layer + 1 or hop.end_layer < hop.start_layer:
            raise _fail(
                f"hop {hop.node_id} must start at layer {previous.end_layer + 1}: "
                "hops must cover the layers contiguously",
                "invalid_plan",
            )
    if hops[-1].end_layer != head.num_layers - 1:
        raise _fail(f"the last hop must end at layer {head.num_layers - 1}", "invalid_plan")
    return GenerateRequest(
        request_id=request_id,
        messages=[{"role": m["role"], "content": m["content"]} for m in messages],
        max_tokens=max_tokens,
        sampling=sampling,
        stop=list(stop),
        resume_token_ids=list(resume),
        model=head.model_key,
        hops=hops,
    )
