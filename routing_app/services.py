"""Routing writes and decisions: route choice, samples, the sessions in flight.

The chat proxy's calls: ``route_choose`` before it opens the stream;
``route_session_open`` each time it (re)sends a stream on a decision,
``route_session_touch`` as tokens arrive and ``route_session_close`` when the
stream ends any way (the session lifecycle: only live streams are a route's
load); ``route_sample_record`` when the stream completes (a failed hop's node
is banned through ``routing_app.bans``). Each reads the policy from the
settings at call time and uses the process's ``route_stats_store()`` unless
given another store.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from nodes_app.models import LanguageModel
from nodes_app.selectors import topology_epoch_current
from routing_app import selectors
from routing_app.choice import DecisionMode, NoRouteAvailable, RouteDecision
from routing_app.config import RoutingConfig
from routing_app.load import LoadSnapshot, RouteLoad, route_load
from routing_app.planner import (
    CandidateCache,
    RoutePlan,
    plan_pinned_route,
    uncovered_layers,
)
from routing_app.stats import RouteStatsStore
from routing_app.tracker_store import route_stats_store

# The tracker's own source of routing randomness; tests pass a seeded one.
_route_rng = random.Random()
# The process's candidate routes per model and topology (ADR-0018, "The cache").
route_candidate_cache = CandidateCache()


def route_candidates(*, model: LanguageModel, store: RouteStatsStore) -> list[RoutePlan]:
    """The model's candidate routes, best prior first.

    Banned nodes take no part in the live candidates (at most ``MAX_CANDIDATES``),
    so the routes go around them; the routes they would have served are appended so
    ``/v1/routing`` shows them as quarantined. Read through ``route_candidate_cache``:
    a node joining, leaving or banned changes them at once.
    """
    nodes = selectors.routing_nodes(model=model)
    banned = store.exclusions.banned_nodes()
    plans = route_candidate_cache.routes(
        model_key=model.key, num_layers=model.num_layers, nodes=nodes, avoid=banned
    )
    if banned:
        live = {plan.signature for plan in plans}
        blocked = [
            plan
            for plan in route_candidate_cache.routes(
                model_key=model.key, num_layers=model.num_layers, nodes=nodes
            )
            if banned.intersection(plan.node_ids) and plan.signature not in live
        ]
        plans = sorted(plans + blocked, key=lambda plan: (-plan.prior_tps, len(plan.hops)))
    return plans


def route_choose(
    *,
    model: LanguageModel,
    pinned: Sequence[str] | None = None,
    rng: random.Random | None = None,
    store: RouteStatsStore | None = None,
    config: RoutingConfig | None = None,
    load: RouteLoad | None = None,
) -> RouteDecision:
    """The route for one chat request: the pinned node ids' plan, or the policy's choice.

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
    plans = route_candidates(model=model, store=store)
    if not plans:
        raise NoRouteAvailable(model.key, _coverage_gap(model))
    policy = (config or RoutingConfig.from_settings()).route_policy()
    rng = rng or _route_rng

    def choose(loads: LoadSnapshot) -> RouteDecision:
        picked = policy.choose(store.views(plans=plans, epoch=epoch), rng=rng, loads=loads)
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
