"""A request's records: open it, then complete and bill it or fail it, exactly once.

:class:`RequestRecord` is what the proxy keeps of one request: the record
opened before anything streams, the route serving it (again after a
failover), and its end: completed and billed (one unit of work per hop of
every route any choice used, :mod:`tracker_app.billing.pricing`), with the
route's speed taught to the router and its nodes' bans cleared; cancelled by
a client that left, billed for what it was sent; partly served (the network
failed a choice after others were sent whole), billed for those; or failed
and never charged. A completed request gets one
billing record with one work unit per hop, in the same transaction as its
completion. The status change is a conditional update, so a request can be
finished only once, whatever races with it.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.utils import timezone
from prometheus_client import Counter

from meshnet_site.database import database_call, through_outage
from nodes_app.models import LanguageModel
from routing_app.exclusions.bans import node_bans_clear
from routing_app.policies.choice import RouteDecision
from routing_app.services import route_sample_record, route_served_record
from tracker_app.api_keys.in_flight import KeyShare
from tracker_app.billing.pricing import HopWork, invoice, work_merged
from tracker_app.completions.generation import Generation
from tracker_app.models import (
    ApiKey,
    BillingRecord,
    ChatRequest,
    RequestApi,
    RequestStatus,
    WorkUnit,
)
from tracker_app.served_answers import served_request_keep

# Prompt tokens billed at the cached price: what the routes took from their prefix caches.
CACHED_PROMPT_TOKENS = Counter(
    "meshnet_cached_prompt_tokens",
    "Prompt tokens of billed requests that the routes did not recompute (prefix-cache hits)",
    ["model"],
)
# Speculative decoding (ADR-0028): drafts the heads sent through their routes, and
# those accepted (each a delivered token), of billed requests.
SPECULATED_TOKENS = Counter(
    "meshnet_speculated_tokens",
    "Draft tokens of billed requests the heads sent through their routes (kind: drafted) "
    "and the last hops accepted (kind: accepted)",
    ["model", "kind"],
)


@dataclass(frozen=True)
class Completion:
    """What a request is recorded and billed for: its choices' tokens, each prompt's once
    (however many of its choices are billed)."""

    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    time_to_first_token_ms: float | None
    tokens_per_second: float | None
    work: list[HopWork]
    # Of ``prompt_tokens``, those the routes did not recompute (counted as they are).
    cached_tokens: int = 0
    # Drafts the choices' heads sent and accepted (ADR-0028).
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    @classmethod
    def of(
        cls,
        generations: Sequence[Generation],
        *,
        n: int,
        elapsed: float,
        first_token_after: float | None,
        sent_only: bool = False,
    ) -> Completion:
        """``generations``: the choices billed; ``n``: choices per prompt; ``elapsed``:
        seconds since the request was opened; ``first_token_after``: seconds to its
        first token, if any came; ``sent_only``: bill only the tokens each choice's client
        was sent (a client that left), not all it produced. The hops' work is what they
        ran for these choices either way."""
        completion = sum(g.delivered if sent_only else len(g.token_ids) for g in generations)
        prompts: dict[int, int] = {}
        cached: dict[int, int] = {}
        for g in generations:
            prompt = g.choice // n
            prompts[prompt] = max(prompts.get(prompt, 0), g.prompt_tokens)
            cached[prompt] = max(cached.get(prompt, 0), g.cached_tokens)
        reasons = {g.finish_reason for g in generations}
        return cls(
            prompt_tokens=sum(prompts.values()),
            cached_tokens=sum(min(cached[p], prompts[p]) for p in prompts),
            completion_tokens=completion,
            # ``length`` if any choice ran out of tokens, else ``stop``.
            finish_reason="length" if "length" in reasons else min(reasons),
            time_to_first_token_ms=None if first_token_after is None else first_token_after * 1000,
            tokens_per_second=completion / elapsed if elapsed > 0 else None,
            work=work_merged(unit for g in generations for unit in g.work()),
            drafted_tokens=sum(g.speculation[0] for g in generations),
            accepted_tokens=sum(g.speculation[1] for g in generations),
        )


class RequestRecord:
    """One request's records, from opening to its one end.

    The record's id is fixed before it exists, so a cancel that races with its
    creation still finds it (database calls run in order on one thread).
    """

    def __init__(
        self,
        *,
        api_key: ApiKey,
        model: LanguageModel,
        fee_share: Decimal,
        sleep: Callable[[float], Awaitable[None]],
        api: str = RequestApi.CHAT_COMPLETIONS,
    ) -> None:
        """``sleep``: the pause between tries of a completion the database refused;
        ``api``: the API the request came through."""
        self.request_id = uuid.uuid4()
        self.api = api
        self.api_key, self.model, self.fee_share, self.sleep = api_key, model, fee_share, sleep

    def open_here(self, *, stream: bool, decision: RouteDecision) -> None:
        """Open the record, naming the route chosen to serve it, on this (database) thread."""
        chat_request_open(
            request_id=self.request_id,
            api_key=self.api_key,
            model=self.model,
            stream=stream,
            now=timezone.now(),
            signature=decision.plan.signature,
            mode=str(decision.mode),
            api=self.api,
        )

    async def route(self, decision: RouteDecision) -> None:
        """Record the route serving the request (again after a failover)."""
        await database_call(chat_request_route)(
            request_id=self.request_id,
            signature=decision.plan.signature,
            mode=str(decision.mode),
        )

    async def complete(
        self,
        completion: Completion,
        *,
        generations: Sequence[Generation],
        now: float,
        share: KeyShare | None = None,
    ) -> None:
        """Record the request completed and billed, keep it for the probe, give back the
        key's ``share`` (all in one call on a database thread), teach the router the
        speed of the first choice's last route (one sample a request, as routing counts
        them) and clear the bans of every node that served it. ``now``: the proxy's clock."""
        kept = False

        def bill_and_keep() -> None:
            nonlocal kept
            self._bill_here(completion)
            if not kept:
                kept = True
                served_request_keep(
                    model_key=self.model.key, request_id=self.request_id, generations=generations
                )
            if share is not None:
                share.release_here()

        # A database blip now would leave a generated answer unbilled; the write is
        # conditional (only a request still processing), so a retry never bills twice.
        await through_outage(lambda: database_call(bill_and_keep)(), sleep=self.sleep)
        if share is not None:
            share.released()
        first = generations[0]
        last = first.segments[-1]
        route_sample_record(
            decision=last.decision, output_tokens=last.produced, elapsed_seconds=now - last.started
        )
        route_served_record(
            decision=last.decision,
            prefix=first.prompt_count.route_prefix(last.produced),
            cached_tokens=first.cached_tokens,
            # From the request's opening: its route's own only if it never moved.
            first_token_seconds=(
                None
                if completion.time_to_first_token_ms is None or len(first.segments) > 1
                else completion.time_to_first_token_ms / 1000
            ),
            output_tokens=last.produced,
            elapsed_seconds=now - last.started,
            drafted=last.drafted,
            accepted=last.accepted,
        )
        node_bans_clear(node_ids=sorted({n for g in generations for n in g.route.plan.node_ids}))

    async def left(self, completion: Completion, *, message: str) -> bool:
        """Record the request cancelled by its client and billed for ``completion``: what
        it was sent before it left. True if this call ended it. No route sample (the
        speed of a cut request means nothing) and no bans cleared."""
        billed = await self._bill(completion, ended=RequestStatus.CANCELLED, error=message)
        return billed is not None

    async def partly_served(self, completion: Completion, *, message: str) -> bool:
        """Record the request failed by the network (``message``) after some choices were
        sent whole, and billed for ``completion``: those choices only. True if this
        call ended it. No route sample and no bans cleared, as for any failure."""
        billed = await self._bill(completion, ended=RequestStatus.PARTIAL, error=message)
        return billed is not None

    async def _bill(
        self,
        completion: Completion,
        *,
        ended: RequestStatus = RequestStatus.COMPLETED,
        error: str = "",
    ) -> BillingRecord | None:
        """Record the request ``ended`` and billed for ``completion``."""
        return await database_call(self._bill_here)(completion, ended=ended, error=error)

    def _bill_here(
        self,
        completion: Completion,
        *,
        ended: RequestStatus = RequestStatus.COMPLETED,
        error: str = "",
    ) -> BillingRecord | None:
        """:meth:`_bill` on this (database) thread."""
        return chat_request_complete(
            request_id=self.request_id,
            model=self.model,
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            cached_tokens=completion.cached_tokens,
            drafted_tokens=completion.drafted_tokens,
            accepted_tokens=completion.accepted_tokens,
            finish_reason=completion.finish_reason,
            time_to_first_token_ms=completion.time_to_first_token_ms,
            tokens_per_second=completion.tokens_per_second,
            work=completion.work,
            fee_share=self.fee_share,
            now=timezone.now(),
            ended=ended,
            error=error,
        )

    async def fail(self, message: str, *, cancelled: bool) -> bool:
        """Record the request failed (or cancelled): True if this call ended it."""
        return await database_call(chat_request_fail)(
            request_id=self.request_id, error=message, now=timezone.now(), cancelled=cancelled
        )


# --- the records themselves (each call one transaction) ------------------------------


def chat_request_open(
    *,
    request_id: uuid.UUID,
    api_key: ApiKey,
    model: LanguageModel,
    stream: bool,
    now: datetime,
    signature: str = "",
    mode: str = "",
    api: str = RequestApi.CHAT_COMPLETIONS,
) -> ChatRequest:
    """Open a request's record, processing (with the route serving it when known: its
    ``signature`` and ``mode``); ``api``: the API it came through."""
    return ChatRequest.objects.create(
        id=request_id,
        api_key=api_key,
        model=model,
        stream=stream,
        api=api,
        started_at=now,
        route_signature=signature,
        mode=mode,
    )


def chat_request_route(*, request_id: uuid.UUID, signature: str, mode: str) -> None:
    """Record the route serving the request (again after a failover)."""
    ChatRequest.objects.filter(pk=request_id).update(route_signature=signature, mode=mode)


def chat_request_complete(
    *,
    request_id: uuid.UUID,
    model: LanguageModel,
    prompt_tokens: int,
    completion_tokens: int,
    finish_reason: str,
    time_to_first_token_ms: float | None,
    tokens_per_second: float | None,
    work: list[HopWork],
    fee_share: Decimal,
    now: datetime,
    ended: RequestStatus = RequestStatus.COMPLETED,
    error: str = "",
    cached_tokens: int = 0,
    drafted_tokens: int = 0,
    accepted_tokens: int = 0,
) -> BillingRecord | None:
    """Mark the request completed (or ``ended`` otherwise: cancelled by a client that
    left mid-stream, with its ``error``) and bill it at ``model``'s prices: its
    ``cached_tokens`` (of the prompt) at the cached price. ``drafted_tokens`` and
    ``accepted_tokens`` (speculation's, ADR-0028) are counted, not billed: the
    completion tokens are what was delivered.

    None if it was already finished (failed, cancelled or billed before).
    """
    bill = invoice(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        prompt_price_per_1k=model.prompt_price_per_1k,
        completion_price_per_1k=model.completion_price_per_1k,
        fee_share=fee_share,
        work=work,
        cached_tokens=cached_tokens,
        cached_price_per_1k=model.cached_prompt_price_per_1k,
    )
    with transaction.atomic():
        finished = ChatRequest.objects.filter(
            pk=request_id, status=RequestStatus.PROCESSING
        ).update(
            status=ended,
            error=error[:2000],
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=min(cached_tokens, prompt_tokens),
            finish_reason=finish_reason,
            time_to_first_token_ms=time_to_first_token_ms,
            tokens_per_second=tokens_per_second,
            finished_at=now,
        )
        if not finished:
            return None
        record = BillingRecord.objects.create(
            request_id=request_id,
            prompt_charge=bill.prompt_charge,
            completion_charge=bill.completion_charge,
            charge=bill.charge,
            network_fee=bill.network_fee,
        )
        # By id: a node that served the request cannot have been deleted (the key
        # constraint is checked at the commit either way).
        WorkUnit.objects.bulk_create(
            WorkUnit(
                billing=record,
                node_id=share.work.node_id,
                start_layer=share.work.start_layer,
                end_layer=share.work.end_layer,
                tokens=share.work.tokens,
                units=share.work.units,
                amount=share.amount,
                route_signature=share.work.route_signature,
            )
            for share in bill.shares
        )
    if cached_tokens:
        CACHED_PROMPT_TOKENS.labels(model=model.key).inc(min(cached_tokens, prompt_tokens))
    if drafted_tokens:
        SPECULATED_TOKENS.labels(model=model.key, kind="drafted").inc(drafted_tokens)
        SPECULATED_TOKENS.labels(model=model.key, kind="accepted").inc(accepted_tokens)
    return record


def chat_request_fail(
    *, request_id: uuid.UUID, error: str, now: datetime, cancelled: bool = False
) -> bool:
    """Mark the request failed (or cancelled by a client that was sent nothing); never
    charged.

    True when this call finished it; False when it had finished already.
    """
    return (
        ChatRequest.objects.filter(pk=request_id, status=RequestStatus.PROCESSING).update(
            status=RequestStatus.CANCELLED if cancelled else RequestStatus.FAILED,
            error=error[:2000],
            finished_at=now,
        )
        > 0
    )


def chat_requests_fail_abandoned(*, now: datetime, older_than: timedelta) -> int:
    """Fail requests still processing long after any generation could last.

    A tracker killed mid-request leaves its rows processing; this closes them
    (uncharged) so the records and the Call wall tell the truth.
    """
    return ChatRequest.objects.filter(
        status=RequestStatus.PROCESSING, started_at__lt=now - older_than
    ).update(status=RequestStatus.FAILED, error="abandoned: the tracker stopped", finished_at=now)
