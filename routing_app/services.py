"""Routing writes and decisions: route choice, samples, the sessions in flight, and the
count of anonymous placement queries.

The chat proxy's calls: ``route_choose`` before it opens the stream;
``route_session_open`` each time it (re)sends a stream on a decision,
``route_session_touch`` as tokens arrive and ``route_session_close`` when the
stream ends any way (the session lifecycle: only live streams are a route's
load); ``route_sample_record`` and ``route_served_record`` when the stream
completes (a failed hop's node is banned through ``routing_app.exclusions.bans``).
Each reads the policy from the settings at call time and uses the process's
``route_stats_store()`` (and ``prefix_memory()``, ``route_costs()``) unless given
another. The
reads (candidates, the routing table, the placement plan) are
``routing_app.selectors``'.

``placement_rate_limit_check`` counts one anonymous ``/api/nodes/placement``
query against its address's window, as registrations are counted.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from django.conf import settings
from django.utils import timezone

from meshnet_site.errors import DomainError, ErrorKind
from meshnet_site.guards.services import count_hit, window_retry_after
from nodes_app.models import LanguageModel
from nodes_app.registration_limit import WINDOW_SECONDS, client_network
from nodes_app.selectors import topology_epoch_current
from routing_app import selectors
from routing_app.learning.prefix_memory import NO_PREFIX, PrefixMemory, RequestPrefix, prefix_memory
from routing_app.learning.route_costs import RouteCostBook, route_costs
from routing_app.learning.stats import RouteStatsStore
from routing_app.learning.tracker_store import route_stats_store
from routing_app.planning.pinned import plan_pinned_route
from routing_app.planning.route_plan import RoutePlan
from routing_app.planning.search import uncovered_layers
from routing_app.policies.choice import DecisionMode, NoRouteAvailable, RouteDecision
from routing_app.policies.config import RoutePolicyConfig
from routing_app.policies.load import LoadSnapshot, RouteLoad, route_load

# The tracker's own source of routing randomness; tests pass a seeded one.
_route_rng = random.Random()


def route_choose(
    *,
    model: LanguageModel,
    pinned: Sequence[str] | None = None,
    rng: random.Random | None = None,
    store: RouteStatsStore | None = None,
    config: RoutePolicyConfig | None = None,
    load: RouteLoad | None = None,
    prefix: RequestPrefix = NO_PREFIX,
    memory: PrefixMemory | None = None,
    costs: RouteCostBook | None = None,
) -> RouteDecision:
    """The route for one chat request: the pinned node ids' plan, or the policy's choice.

    ``prefix`` is what the request's prompt is (its scoped block chain): a route
    whose nodes ``memory`` (the process's by default) believes hold some of it
    is weighed for the prefill it would save at its learned ``costs``
    (docs/adr/0029-cache-aware-routing.md).

    The decision counts as a session in flight on its route (the load the
    ``thompson-load`` policy weighs) until ``route_sample_record`` or
    ``route_session_close`` is called with it: the caller closes it on every
    path, including one that fails before the stream starts. The chat path
    chooses on several threads at once: the policy's choice and the session
    it opens are one step (under ``load``'s lock), so two requests never both
    see an unmeasured route idle and both scout it.

    Raises ``InvalidPinnedRoute`` for a pinned route that cannot serve the
    model, ``PinnedNodeUnavailable`` when a pinned node is not online and
    ``NoRouteAvailable`` when no route can serve the model (every candidate
    kept out, or none at all). Send the request to
    ``decision.plan.head.endpoint`` with ``decision.plan.to_dict()`` as hops.
    """
    store = store or route_stats_store()
    load = load or route_load()
    epoch = topology_epoch_current(model=model)
    if pinned is not None:
        nodes = selectors.routing_nodes(model=model)
        plan = plan_pinned_route(
            model_key=model.key,
            num_layers=model.num_layers,
            node_ids=pinned,
            online={node.node_id: node for node in nodes},
            known=selectors.node_ids_known(model=model, node_ids=pinned),
        )
        decision = RouteDecision(plan=plan, mode=DecisionMode.PINNED, epoch=epoch)
        load.open(decision)
        return decision
    plans = selectors.route_candidates(model=model, store=store)
    if not plans:
        raise NoRouteAvailable(model.key, _coverage_gap(model))
    policy = (config or RoutePolicyConfig.from_settings()).route_policy()
    rng = rng or _route_rng
    warm = (memory or prefix_memory()).warmth(plans, prefix, costs or route_costs())

    def choose(loads: LoadSnapshot) -> RouteDecision:
        views = store.views(plans=plans, epoch=epoch)
        picked = policy.choose(views, rng=rng, loads=loads, warm=warm)
        if picked is None:
            raise NoRouteAvailable(model.key, _kept_out_reason(plans, store))
        arm, mode = picked
        return RouteDecision(plan=arm.plan, mode=mode, epoch=epoch)

    return load.open_chosen(choose)


def route_session_open(
    *,
    decision: RouteDecision,
    stream: object | None = None,
    planned: int = 0,
    load: RouteLoad | None = None,
) -> None:
    """``stream`` (one of the request's streams, e.g. one choice's generation) is being
    sent on ``decision``'s route, where it may produce up to ``planned`` tokens (0: not
    known): it counts as load there, and its pace is read against ``planned``.

    Idempotent, and it re-opens a closed session: call it each time a stream
    on ``decision`` (re)starts, e.g. after waiting for a busy route's slot.
    The session ``route_choose`` opened for the request gives way to its
    first stream's, so nothing is counted twice.
    """
    (load or route_load()).open(decision, stream, planned=planned)


def route_session_touch(
    *,
    decision: RouteDecision,
    stream: object | None = None,
    tokens: int | None = None,
    load: RouteLoad | None = None,
) -> None:
    """``stream`` on ``decision``'s route made progress (``tokens`` produced since it was
    sent, when given): it keeps counting as load, and ``thompson-load`` reads its pace.

    A session with no sign of life for ``load.SESSION_TTL`` seconds is taken for
    a lost close and forgotten; a slow long generation touches its session so
    it is not. Does nothing to a closed session.
    """
    (load or route_load()).touch(decision, stream, tokens=tokens)


def route_session_close(
    *, decision: RouteDecision, stream: object | None = None, load: RouteLoad | None = None
) -> None:
    """``stream`` on ``decision``'s route ended (any way): it is no longer load. With no
    ``stream``, every session on the decision ends (the request is over).

    Idempotent; ``route_sample_record`` closes the whole decision too.
    """
    (load or route_load()).close(decision, stream)


def _kept_out_reason(plans: Sequence[RoutePlan], store: RouteStatsStore) -> str:
    """Why every candidate is kept out, as it is: banned nodes, quarantines, or both."""
    banned = store.exclusions.banned_nodes()
    through_banned = [any(n in banned for n in plan.node_ids) for plan in plans]
    if all(through_banned):
        named = ", ".join(sorted({n for plan in plans for n in plan.node_ids if n in banned}))
        return f"every candidate route goes through a banned node ({named})"
    if not any(through_banned):
        return "every candidate route is quarantined"
    return "every candidate route is quarantined or goes through a banned node"


def _coverage_gap(model: LanguageModel) -> str:
    """Why the online nodes form no route, naming the layers nobody serves."""
    gaps = uncovered_layers(selectors.routing_nodes(model=model), model.num_layers)
    if not gaps:
        return "the online nodes cover every layer but form no chain from layer 0"
    named = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in gaps)
    return f"no online node serves layers {named} (of 0-{model.last_layer})"


def route_sample_record(
    *,
    decision: RouteDecision,
    output_tokens: int,
    elapsed_seconds: float,
    store: RouteStatsStore | None = None,
    load: RouteLoad | None = None,
) -> bool:
    """Learn the speed of a completed request (pinned ones too); returns whether it counted.

    The decision's session ends here (it is no longer load on its route).

    ``elapsed_seconds`` is the end-to-end time of the generation as the
    tracker saw it. Near-empty completions are rejected (see ``RouteArms``).
    """
    route_session_close(decision=decision, load=load)
    if elapsed_seconds <= 0:
        return False
    store = store or route_stats_store()
    return store.arms.record_sample(
        model_key=decision.plan.model_key,
        signature=decision.plan.signature,
        epoch=decision.epoch,
        output_tokens=output_tokens,
        tokens_per_second=output_tokens / elapsed_seconds,
    )


def route_served_record(
    *,
    decision: RouteDecision,
    prefix: RequestPrefix,
    cached_tokens: int,
    first_token_seconds: float | None,
    output_tokens: int,
    elapsed_seconds: float,
    drafted: int = 0,
    accepted: int = 0,
    memory: PrefixMemory | None = None,
    costs: RouteCostBook | None = None,
) -> None:
    """A request whose prompt is ``prefix`` completed on ``decision``'s route: its nodes
    hold the prompt's blocks now (``memory``), and it teaches the route's ``costs``: the
    prompt tokens it computed, ``cached_tokens`` fewer than the prompt's, before its
    first token after ``first_token_seconds`` (when known), ``output_tokens`` in
    ``elapsed_seconds``, ``drafted`` and ``accepted`` of them speculated (ADR-0028)."""
    (memory or prefix_memory()).served(plan=decision.plan, blocks=prefix.blocks)
    (costs or route_costs()).timed(
        plan=decision.plan,
        prompt_computed=prefix.prompt_tokens - cached_tokens,
        first_token_seconds=first_token_seconds,
        output_tokens=output_tokens,
        seconds=elapsed_seconds,
        drafted=drafted,
        accepted=accepted,
    )


class PlacementRateLimited(DomainError):
    """This address asked for placements too often this minute; ``retry_after`` says when
    the next window opens."""

    kind = ErrorKind.RATE_LIMITED
    code = "placement_rate_limited"


def placement_rate_limit_check(*, client_address: str) -> None:
    """Count one anonymous placement query from ``client_address`` (counted as
    registrations are); ``PlacementRateLimited`` past ``MESHNET_PLACEMENT_RATE_LIMIT`` in
    the current minute."""
    now = timezone.now()
    network = client_network(client_address)
    limit = settings.MESHNET_PLACEMENT_RATE_LIMIT
    count = count_hit(f"placement:{network}", window_seconds=WINDOW_SECONDS, now=now)
    if count > limit:
        retry_after = window_retry_after(window_seconds=WINDOW_SECONDS, now=now)
        raise PlacementRateLimited(
            f"Too many placement queries from {network}: at most {limit} per minute; "
            f"retry in {retry_after} s",
            retry_after=retry_after,
        )
