"""Sending the route-equivalence probe: the tracker side of ADR-0007's verification.

Two probes. The fixed one is a greedy chat request sent straight to every
candidate route's head with the protocol's ``GenerateRequest``: cheap and
quick after a topology change, but a node that learns its fingerprint (the
prompt, its length, the logprobs it asks) could answer it honestly and
clients dishonestly. So the probe that counts judges what routes served
clients (:func:`served_answers_check`): a sample of real requests
(``tracker_app.served_answers``) is re-run on other routes with its own
prompt, parameters and length, and the whole answer the route gave the
client is compared; no fingerprint, length or position tells such a probe
from traffic, because it *is* traffic.

Both ask each token's logprob and its best alternatives (a re-run on the
other routes, where the fingerprint does not matter), so that routes of
mixed precision that part at a rounding near-tie are not judged corrupt
(ADR-0015). Neither passes the proxy: no request record, no bill, no route
sample. A verdict is kept in a ``RouteProbe`` row (without the tokens of a
client's request). Verdicts: ``routing_app.exclusions.probe_verdicts``; quarantines:
``routing_app.exclusions.quarantines``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
import uuid
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import replace
from datetime import datetime, timedelta

import httpx
from django.conf import settings

from nodes_app.models import LanguageModel, Node
from nodes_app.plans import plan_sign
from nodes_app.protocol.generate import GenerateRequest
from nodes_app.protocol.logprobs import TokenLogprob
from nodes_app.protocol.registration import DEFAULT_PRECISION
from nodes_app.protocol.sampling import SamplingParams
from nodes_app.protocol.signed_plan import PlanHop
from nodes_app.selectors import topology_epoch_current
from routing_app.exclusions.probe_verdicts import (
    PROBE_TIE_MARGIN,
    ProbeAnswer,
    Verdict,
    probe_verdicts,
    rerun_routes,
    self_rerun_needed,
    served_verdicts,
)
from routing_app.exclusions.quarantines import (
    ProbeRunSummary,
    probe_results_record,
    quarantines_active,
    quarantines_due,
)
from routing_app.models import ProbeOutcome, RouteProbe
from routing_app.planning.route_plan import RoutePlan
from routing_app.planning.search import enumerate_routes
from routing_app.selectors import routing_nodes
from tracker_app.billing.audits import billing_audit_queue
from tracker_app.completions.head_stream import (
    HeadRefused,
    HopFailure,
    RouteBusy,
    head_stream,
    silence_limit,
)
from tracker_app.completions.prompt_tokens import prompt_tokens_bound
from tracker_app.served_answers import ServedSample, served_answers_take

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
# What a re-run of a served request adds to that per token it may generate.
PROBE_SECONDS_PER_TOKEN = 0.5

ProbeSender = Callable[[RoutePlan], ProbeAnswer]
RerunSender = Callable[[ServedSample, RoutePlan], ProbeAnswer]


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


async def probe_send_async(
    plan: RoutePlan, client: httpx.AsyncClient, request: GenerateRequest | None = None
) -> ProbeAnswer:
    """Run the probe along ``plan`` (or ``request``, a served one re-run: its plan is
    ``plan``); any failure becomes the answer's ``error``."""
    began = time.perf_counter()
    token_ids: list[int] = []
    logprobs: list[TokenLogprob] = []
    unsigned = request or probe_request(plan)
    # Long answers take long: a re-run may be as long as the request it repeats.
    limit = PROBE_TIMEOUT_SECONDS + unsigned.max_tokens * PROBE_SECONDS_PER_TOKEN

    async def read() -> None:
        silence = silence_limit(
            step_timeout=settings.MESHNET_HOP_STEP_TIMEOUT,
            hops=len(plan.hops),
            # Characters bound the prompt in tokens from above.
            positions=unsigned.prompt_characters + unsigned.max_tokens,
        )
        # The prompt is not counted here: the body's bound stands for it in the plan.
        prompt = unsigned.prompt if unsigned.prompt is not None else unsigned.messages
        prompt_tokens = prompt_tokens_bound(prompt, unsigned.tools)
        signed = plan_sign(unsigned, prompt_tokens=prompt_tokens, silence=silence)
        frames = head_stream(client=client, request=signed, silence=silence)
        async with aclosing(frames):
            async for frame in frames:
                token_ids.extend(frame.token_ids)
                # Entries stay a prefix aligned with the token ids: the protocol
                # lets a frame come without them, and positions must not shift.
                if len(logprobs) == len(token_ids) - len(frame.token_ids):
                    logprobs.extend(frame.logprobs)

    try:
        await asyncio.wait_for(read(), limit)
    except HopFailure as failure:
        return ProbeAnswer(error=f"node {failure.node_id} failed: {failure.message}")
    except RouteBusy:
        return ProbeAnswer(error="the route's nodes were at their session cap")
    except HeadRefused as refused:
        return ProbeAnswer(error=refused.message)
    except TimeoutError:
        return ProbeAnswer(error=f"no answer within {limit:.0f} s")
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


def rerun_send(sample: ServedSample, plan: RoutePlan) -> ProbeAnswer:
    """Re-run a served request on ``plan``, as the proxy would send it there."""
    request = sample.rerun(plan, request_id=str(uuid.uuid4()), top_logprobs=PROBE_TOP_LOGPROBS)

    async def send() -> ProbeAnswer:
        async with httpx.AsyncClient() as client:
            return await probe_send_async(plan, client, request)

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
    billing_audit_queue()


def served_answers_check(
    *,
    model: LanguageModel,
    now: datetime,
    lookback: timedelta,
    count: int,
    max_age: timedelta,
    rng: random.Random,
    send: RerunSender = rerun_send,
) -> list[ProbeRunSummary]:
    """Re-run up to ``count`` of the model's served requests on other routes and judge
    the answers their routes gave clients
    (:func:`routing_app.exclusions.probe_verdicts.served_verdicts`).

    Each sample is taken out of the store as it is drawn (checked once). A
    sample whose route is quarantined already is dropped unchecked. The
    re-runs go to :func:`~routing_app.exclusions.probe_verdicts.rerun_routes` of the current
    candidates (quarantined ones left out), one after the other, and to the
    served route itself when they settle nothing.
    """
    samples = served_answers_take(
        model_key=model.key, count=count, now=now, max_age=max_age, rng=rng
    )
    if not samples:
        return []
    epoch = topology_epoch_current(model=model)
    quarantined = quarantines_active(model_key=model.key)
    candidates = [
        plan
        for plan in enumerate_routes(
            model_key=model.key, num_layers=model.num_layers, nodes=routing_nodes(model=model)
        )
        if plan.signature not in quarantined
    ]
    rounding = _rounding_nodes(model)

    def rounds(plan: RoutePlan) -> bool:
        return not rounding.isdisjoint(plan.node_ids)

    summaries = []
    for sample in samples:
        if sample.plan.signature in quarantined:
            continue
        sample = replace(sample, answer=replace(sample.answer, rounded=rounds(sample.plan)))
        reruns = [
            (plan, replace(send(sample, plan), rounded=rounds(plan)))
            for plan in rerun_routes(sample.plan, candidates)
        ]
        verdicts = _served_judged(sample, reruns, send)
        summary = probe_results_record(
            model_key=model.key,
            epoch=epoch,
            verdicts=verdicts,
            now=now,
            lookback=lookback,
            on_quarantine=audit_queue,
        )
        for signature in summary.quarantined:
            logger.warning("a served answer's re-run quarantined %s", signature)
        quarantined |= set(summary.quarantined)
        summaries.append(summary)
    return summaries


def _rounding_nodes(model: LanguageModel) -> set[str]:
    """The model's nodes that compute below float32 (another dtype, or quantised weights)."""
    nodes = Node.objects.filter(model=model).exclude(precision=DEFAULT_PRECISION)
    return {str(node_id) for node_id in nodes.values_list("id", flat=True)}


def _served_judged(
    sample: ServedSample, reruns: list[tuple[RoutePlan, ProbeAnswer]], send: RerunSender
) -> list[Verdict]:
    """The verdicts on ``sample``, its own route re-run when the others do not settle it.

    An answer served without logprobs (the client asked none) cannot part at
    a rounding near-tie by ADR-0015's rule, which needs both routes' own: so
    when it disagrees, the served route is re-run too. An honest route
    answers the deterministic request with the very same tokens, and then
    lends the served answer its logprobs; a route that answers otherwise has
    answered one request two ways, and disagrees whatever the others say.
    """
    # A sampled answer re-runs with its seed, but rounding (a route of mixed precision)
    # can move a draw across a token boundary where the two tokens are not near-tied:
    # there the routes may part anywhere, wherever each lists the other's token or
    # one rounds (ADR-0015).
    margin = PROBE_TIE_MARGIN if sample.greedy else math.inf
    served = (sample.plan, sample.answer)
    verdicts = served_verdicts(served, reruns, margin=margin)
    unscored = verdicts[0].outcome is ProbeOutcome.DISAGREED and not sample.answer.logprobs
    if not (unscored or self_rerun_needed(verdicts, margin=margin)):
        return verdicts
    own = replace(send(sample, sample.plan), rounded=sample.answer.rounded)
    if own.token_ids == sample.answer.token_ids and len(own.logprobs) == len(own.token_ids):
        served = (sample.plan, replace(sample.answer, logprobs=own.logprobs))
    return served_verdicts(served, reruns, self_rerun=own, margin=margin)
