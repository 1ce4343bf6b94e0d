"""Sending the route-equivalence probe: the tracker side of ADR-0007's verification.

A probe is a fixed greedy chat request sent straight to a route's head with
the protocol's ``GenerateRequest``, exactly as the chat proxy sends a
client's: a node cannot tell a probe from traffic, so it cannot answer
probes honestly and clients dishonestly (as far as a fixed prompt allows:
docs/SECURITY.md). It asks for each token's logprob and its best
alternatives, as clients may, so that routes of mixed precision that part
at a rounding near-tie are not judged corrupt (ADR-0015). It is a probe only on the
tracker's side: it never passes the proxy, so it opens no request record,
is never billed and never becomes a route sample; its answer is kept in a
``RouteProbe`` row. Verdicts: ``routing_app.probing``; quarantines: ``routing_app.quarantines``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from contextlib import aclosing
from datetime import datetime, timedelta

import httpx
from django.conf import settings

from meshnet_site.celery import app as celery_app
from nodes_app.models import LanguageModel
from nodes_app.plans import plan_sign
from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.logprobs import TokenLogprob
from nodes_app.protocol.sampling import SamplingParams
from nodes_app.protocol.signed_plan import PlanHop
from nodes_app.selectors import topology_epoch_current
from routing_app.models import RouteProbe
from routing_app.planner import RoutePlan, enumerate_routes
from routing_app.probing import ProbeAnswer, probe_verdicts
from routing_app.quarantines import (
    ProbeRunSummary,
    probe_results_record,
    quarantines_active,
    quarantines_due,
)
from routing_app.selectors import routing_nodes
from tracker_app.completions.head_stream import (
    HeadRefused,
    HopFailure,
    RouteBusy,
    head_stream,
    silence_limit,
)
from tracker_app.completions.prompt_tokens import prompt_tokens_bound

logger = logging.getLogger(__name__)

# Fixed, so every route answers the same question; greedy, so the same
# weights give the same tokens. Long enough for a corrupt hop to show, short
# enough to probe eight SmolLM2 routes in seconds.
PROBE_MESSAGES = [{"role": "user", "content": "List the first five prime numbers."}]
PROBE_MAX_TOKENS = 12
# Alternatives per token: a rounding near-tie is between the best two, and 5
# is the most the legacy completions endpoint lets a client ask for.
PROBE_TOP_LOGPROBS = 5
PROBE_TIMEOUT_SECONDS = 120.0

AUDIT_TASK = "billing.audit"

ProbeSender = Callable[[RoutePlan], ProbeAnswer]


def probe_request(plan: RoutePlan) -> GenerateRequest:
    """The probe for ``plan``: on the wire a client's greedy request with logprobs."""
    return GenerateRequest(
        request_id=str(uuid.uuid4()),
        model=plan.model_key,
        hops=tuple(
            PlanHop(hop.node_id, hop.endpoint, hop.start_layer, hop.end_layer) for hop in plan.hops
        ),
        messages=PROBE_MESSAGES,
        max_tokens=PROBE_MAX_TOKENS,
        sampling=SamplingParams(temperature=0.0),
        logprobs=True,
        top_logprobs=PROBE_TOP_LOGPROBS,
    )


async def probe_send_async(plan: RoutePlan, client: httpx.AsyncClient) -> ProbeAnswer:
    """Run the probe along ``plan``; any failure becomes the answer's ``error``."""
    began = time.perf_counter()
    token_ids: list[int] = []
    logprobs: list[TokenLogprob] = []

    async def read() -> None:
        unsigned = probe_request(plan)
        silence = silence_limit(
            step_timeout=settings.MESHNET_HOP_STEP_TIMEOUT,
            hops=len(plan.hops),
            # Characters bound the probe's short prompt in tokens from above.
            positions=sum(len(m["content"]) for m in unsigned.messages) + PROBE_MAX_TOKENS,
        )
        # The probe's prompt is not counted here: the body's bound stands for it.
        prompt_tokens = prompt_tokens_bound(unsigned.messages)
        request = plan_sign(unsigned, prompt_tokens=prompt_tokens, silence=silence)
        frames = head_stream(client=client, request=request, silence=silence)
        async with aclosing(frames):
            async for frame in frames:
                token_ids.extend(frame.token_ids)
                # Entries stay a prefix aligned with the token ids: the protocol
                # lets a frame come without them, and positions must not shift.
                if len(logprobs) == len(token_ids) - len(frame.token_ids):
                    logprobs.extend(frame.logprobs)

    try:
        await asyncio.wait_for(read(), PROBE_TIMEOUT_SECONDS)
    except HopFailure as failure:
        return ProbeAnswer(error=f"node {failure.node_id} failed: {failure.message}")
    except RouteBusy:
        return ProbeAnswer(error="the route's nodes were at their session cap")
    except HeadRefused as refused:
        return ProbeAnswer(error=refused.message)
    except TimeoutError:
        return ProbeAnswer(error=f"no answer within {PROBE_TIMEOUT_SECONDS:.0f} s")
    return ProbeAnswer(
        token_ids=tuple(token_ids),
        elapsed_ms=(time.perf_counter() - began) * 1000,
        logprobs=tuple(logprobs),
    )


def probe_send(plan: RoutePlan) -> ProbeAnswer:
    """:func:`probe_send_async` for a synchronous caller (the Celery task)."""

    async def send() -> ProbeAnswer:
        async with httpx.AsyncClient() as client:
            return await probe_send_async(plan, client)

    return asyncio.run(send())


def route_probes_run(
    *,
    model: LanguageModel,
    now: datetime,
    lookback: timedelta,
    due_only: bool = False,
    send: ProbeSender = probe_send,
) -> ProbeRunSummary | None:
    """Probe the model's candidate routes and apply the verdicts; None if nothing to probe.

    Every candidate is probed, except quarantined routes whose re-probe is
    not due yet. With ``due_only`` the run happens only when some
    quarantined route is due (the back-off re-probe). Routes are probed one
    after the other, so a probe never competes with itself for a node.
    """
    epoch = topology_epoch_current(model=model)
    plans = enumerate_routes(
        model_key=model.key, num_layers=model.num_layers, nodes=routing_nodes(model=model)
    )
    due = quarantines_due(model_key=model.key, now=now)
    if not plans or (due_only and not due.intersection(plan.signature for plan in plans)):
        return None
    quarantined = quarantines_active(model_key=model.key) - due
    answers = [(plan, send(plan)) for plan in plans if plan.signature not in quarantined]
    summary = probe_results_record(
        model_key=model.key,
        epoch=epoch,
        verdicts=probe_verdicts(answers),
        now=now,
        lookback=lookback,
        on_quarantine=audit_queue,
    )
    for signature in summary.quarantined:
        logger.warning("probe quarantined %s", signature)
    return summary


def route_probe_done(*, model: LanguageModel, epoch: int) -> bool:
    """Whether the model's routes were already probed under ``epoch`` (or it has moved on)."""
    if topology_epoch_current(model=model) != epoch:
        return True  # a newer change queued a probe of its own
    return RouteProbe.objects.filter(model_key=model.key, epoch=epoch).exists()


def audit_queue() -> None:
    """Queue a billing audit now (a route was just quarantined: refund its charges)."""
    try:
        celery_app.send_task(AUDIT_TASK, ignore_result=True)
    except Exception:  # the hourly audit will find it
        logger.warning("could not queue the billing audit", exc_info=True)
