"""The head's input: a ``/v1/generate`` body parsed by the protocol, checked against this node.

:class:`nodes_app.protocol.generate.GenerateRequest` checks what holds for any node;
here the head checks what only it can: that it is hop 0 of a plan for the
model it serves, that hop 0 fits its shard, that the plan ends at the
model's last layer and that resumed token ids and logit_bias ids are in its
vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.limits import GENERATE_MAX_PROMPT_CHARS
from nodes_app.runtime.engine.sampler import check_logit_bias
from nodes_app.runtime.faults import RuntimeRequestError


@dataclass(frozen=True)
class HeadIdentity:
    """What the head checks hop 0 against."""

    node_id: str
    model_key: str
    shard_start: int
    shard_end: int
    num_layers: int
    vocab_size: int
    max_prompt_chars: int = GENERATE_MAX_PROMPT_CHARS


def parse_generate_request(body: Any, head: HeadIdentity) -> GenerateRequest:
    """Validate ``body`` for this head; raises :class:`RuntimeRequestError` (400) on anything wrong.

    Codes: the protocol's (``invalid_request``, ``invalid_plan``,
    ``bad_sampling``), then ``wrong_model``, ``not_head`` and ``invalid_plan``
    for a plan this head cannot run, ``bad_sampling`` for logit_bias ids past
    the vocabulary, ``prompt_too_long`` for a prompt past the head's
    character cap (checked before anything is tokenised).
    """
    try:
        request = GenerateRequest.parse(body)
    except ProtocolError as error:
        raise RuntimeRequestError.refusing(error) from None
    head_check(request, head)
    characters = request.prompt_characters
    if characters > head.max_prompt_chars:
        raise RuntimeRequestError(
            f"the prompt holds {characters} characters; this node takes at most "
            f"{head.max_prompt_chars}",
            code="prompt_too_long",
        )
    return request


def head_check(request: GenerateRequest, head: HeadIdentity) -> None:
    """Refuse a well-formed request that this head cannot serve."""
    if request.model != head.model_key:
        raise RuntimeRequestError(
            f"this node serves {head.model_key}, not {request.model}", code="wrong_model"
        )
    first = request.hops[0]
    if first.node_id != head.node_id:
        raise RuntimeRequestError(
            f"plan hop 0 is {first.node_id}, not this node ({head.node_id})", code="not_head"
        )
    if first.end_layer > head.shard_end:
        raise RuntimeRequestError(
            f"hop 0 must run layers 0..e with e <= {head.shard_end} on this node",
            code="invalid_plan",
        )
    if request.hops[-1].end_layer != head.num_layers - 1:
        raise RuntimeRequestError(
            f"the last hop must end at layer {head.num_layers - 1}", code="invalid_plan"
        )
    if any(token >= head.vocab_size for token in request.resume_token_ids):
        raise RuntimeRequestError(
            f"resume_token_ids must be token ids below {head.vocab_size}", code="invalid_request"
        )
    check_logit_bias(request.sampling, head.vocab_size)


def check_grant(request: GenerateRequest, prompt_tokens: int) -> None:
    """Refuse (403 ``plan_exceeded``) a request its signed plan does not cover.

    The head's sessions reserve the prompt plus ``max_tokens`` positions on
    every hop, and each hop refuses what its plan does not grant: the head
    checks it before any hop is asked, so that a disagreement between the
    tracker's count of the prompt and its own is its fault, never a hop's.
    An unsigned plan (dev-open) grants anything.
    """
    wanted = prompt_tokens + request.max_tokens
    if request.signature and wanted > request.max_positions:
        raise RuntimeRequestError(
            f"the prompt ({prompt_tokens} tokens) plus max_tokens ({request.max_tokens}) is "
            f"more than the {request.max_positions} positions the plan grants",
            code="plan_exceeded",
            status=403,
            error_type="permission_error",
        )
