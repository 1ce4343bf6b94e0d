"""A request's admission: count its prompts, take its key's share, choose its route.

Before anything is streamed, :func:`admit` counts every prompt with the
model's tokenizer (:mod:`~tracker_app.completions.prompt_tokens`: a prompt
past the context, a chat template over its budget, an echo or a grammar the
model cannot serve is refused here), takes the request's lease on its API
key's share of requests and KV tokens in flight (:func:`kv_reservation`,
:mod:`~tracker_app.api_keys.in_flight`), chooses the route
(:mod:`routing_app.services`) and opens the request's record with it
(:mod:`~tracker_app.completions.recording`) — all in one call on a database
thread, giving back whatever it took if a later step fails. The key's share
is taken before any route is chosen: a request past it is refused at once,
not after the busy deadline on a route its own key filled.

:func:`admitted_generations` turns what was admitted into the request's
choices, each on the chosen route from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from meshnet_site.database import database_call
from nodes_app.models import LanguageModel
from nodes_app.services import language_model_template_fault
from nodes_app.shared.prefix_chain import chain_seed
from routing_app.policies.choice import RouteDecision
from routing_app.services import route_choose, route_session_close
from tracker_app.api_keys.in_flight import KeyShare
from tracker_app.completions.generation import Generation, Segment
from tracker_app.completions.parameters import GenerationParams
from tracker_app.completions.prompt_tokens import (
    ChatTemplateOverBudget,
    PromptCount,
    echo_check,
    grammar_check,
    prompt_tokens_count,
)
from tracker_app.completions.recording import RequestRecord


@dataclass(frozen=True)
class Admitted:
    """What an admitted request runs on: each prompt's count, and the route chosen."""

    counts: list[PromptCount]
    decision: RouteDecision


async def admit(
    *,
    params: GenerationParams,
    model: LanguageModel,
    share: KeyShare,
    record: RequestRecord,
    prefix_scope: str,
    abandoned: Callable[[RouteDecision], None],
) -> Admitted:
    """Count the prompts, take the key's ``share``, choose the route and open the
    ``record`` (with that route), in one call on a database thread: one pooled
    connection, one hop off the event loop (:func:`admit_here`).

    Raises a ``DomainError`` (a prompt the model refuses, the key's share used
    up, no route, bad pinned route) before anything is streamed, so the client
    gets a plain error response; the share is given back then. A request torn
    down meanwhile (its client left) lets the call end first and hands the route
    it chose to ``abandoned``, so that what it took can be given back.
    """
    # Held from the start: a request cancelled while its lease is written still
    # deletes it on release (deleting a row never written is harmless).
    share.claim()
    admission = asyncio.ensure_future(
        database_call(admit_here)(
            params=params, model=model, share=share, record=record, prefix_scope=prefix_scope
        )
    )
    try:
        admitted = await asyncio.shield(admission)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            abandoned((await admission).decision)
        raise
    except BaseException:
        await asyncio.shield(share.release())
        raise
    share.held()
    return admitted


def admit_here(
    *,
    params: GenerationParams,
    model: LanguageModel,
    share: KeyShare,
    record: RequestRecord,
    prefix_scope: str = "",
) -> Admitted:
    """What :func:`admit` does, on this (database) thread: the prompts' counts (the
    tokenizer, off the event loop) and the route chosen, weighing where the first
    prompt's prefix is warm in ``prefix_scope`` (none without one); the key's lease and
    the request's record are written. Whatever fails gives back what was taken before it.
    """
    # An echo scores every prompt position: its route neither claims nor keeps a prefix.
    reuses = prefix_scope and not params.prompt_scored
    prefix_seed = chain_seed(model.key, prefix_scope) if reuses else ""
    try:
        counts = [
            prompt_tokens_count(
                weight_source=model.weight_source,
                prompt=prompt,
                max_tokens=params.max_tokens,
                tools=params.template_tools,
                prefix_seed=prefix_seed,
            )
            for prompt in params.prompts
        ]
    except ChatTemplateOverBudget as error:
        language_model_template_fault(model=model, fault=error.message)
        raise
    if params.prompt_scored:
        for count in counts:
            echo_check(prompt=count, top_logprobs=params.top_logprobs)
    grammar_check(
        weight_source=model.weight_source,
        grammar=params.grammar,
        param="tools" if params.tool_use is not None else params.format_param,
    )
    share.take_here(kv_tokens=kv_reservation(params, [count.tokens for count in counts]))
    try:
        decision = route_choose(
            model=model, pinned=params.route, prefix=counts[0].route_prefix(params.max_tokens)
        )
    except BaseException:
        share.release_here()
        raise
    try:
        record.open_here(stream=params.stream, decision=decision)
    except BaseException:
        # Never streamed: the route's load must not count it, nor the key's share.
        route_session_close(decision=decision)
        share.release_here()
        raise
    return Admitted(counts=counts, decision=decision)


def kv_reservation(params: GenerationParams, prompt_tokens: Sequence[int]) -> int:
    """What the request's choices reserve on the nodes: (prompt + max_tokens) each;
    ``prompt_tokens``: each prompt's count."""
    n = params.n
    return sum(prompt_tokens[choice // n] + params.max_tokens for choice in range(params.choices))


def admitted_generations(
    params: GenerationParams,
    admitted: Admitted,
    *,
    clock: Callable[[], float],
    prefix_scope: str = "",
) -> list[Generation]:
    """The request's choices (``n`` for each prompt), each served by the admitted route
    from now on (``clock``: when each began on it), their plans scoped ``prefix_scope``."""
    generations = [
        Generation(
            choice=choice,
            prompt=params.prompt_of(choice),
            prompt_count=admitted.counts[choice // params.n],
            sampling=params.sampling(choice),
            prefix_scope=prefix_scope,
        )
        for choice in range(params.choices)
    ]
    for generation in generations:
        generation.segments.append(Segment(decision=admitted.decision, replayed=0, started=clock()))
    return generations
