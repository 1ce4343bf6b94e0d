"""Node registry writes: register, heartbeat, deregister, liveness sweep, admin actions,
and the topology epochs those changes bump.

Every change of who serves which layers goes through here and bumps the
model's topology epoch exactly once. Failures raise the ``DomainError``
subclasses below; ``meshnet_site.errors`` turns them into HTTP answers.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import transaction
from django.db.models import F, QuerySet

from meshnet_site.errors import DomainError, ErrorKind
from meshnet_site.guards.services import claim_once
from nodes_app.endpoints import EndpointGate, EndpointNotAllowed
from nodes_app.events import epoch_announce, node_heartbeat_announce, nodes_announce
from nodes_app.models import LanguageModel, Node, NodeStatus, TopologyEpoch
from nodes_app.protocol.registration import DEFAULT_PRECISION
from nodes_app.registration_checks import (
    SERVING,
    NodeBanned,
    catalogue_model,
    check_benchmark,
    check_endpoint_free,
    check_shard,
    check_wallet_not_banned,
)
from nodes_app.selectors import topology_epoch_current
from nodes_app.shared.signing import verify_registration
from nodes_app.signals import topology_changed


class RegistrationNotTrusted(DomainError):
    """A registration whose signature, timestamp or freshness the tracker cannot trust.

    ``code`` says which: ``invalid_signature``, ``stale_registration`` or
    ``replayed_registration``.
    """

    kind = ErrorKind.UNAUTHENTICATED


class NodeTokenInvalid(DomainError):
    """A node call without a valid node token (unknown node and wrong token alike)."""

    kind = ErrorKind.UNAUTHENTICATED
    code = "invalid_node_token"


@dataclass(frozen=True)
class Registration:
    node: Node
    token: str
    epoch: int


def topology_epoch_bump(*, model: LanguageModel, reason: str) -> int:
    """Advance ``model``'s topology epoch and return the new number.

    The one place epochs change: every join, leave and shard change calls it.
    The increment is a single UPDATE, so concurrent bumps never lose a count.
    ``topology_changed`` is sent once the caller's transaction commits.
    """
    with transaction.atomic():
        epoch, _ = TopologyEpoch.objects.get_or_create(model=model)
        TopologyEpoch.objects.filter(pk=epoch.pk).update(
            number=F("number") + 1, reason=reason[:200]
        )
        epoch.refresh_from_db(fields=["number"])
        epoch_announce(model_key=model.key, epoch=epoch.number, reason=reason[:200])
        transaction.on_commit(
            partial(
                topology_changed.send_robust,
                sender=TopologyEpoch,
                model_key=model.key,
                epoch=epoch.number,
            )
        )
    return epoch.number


def language_model_template_fault(*, model: LanguageModel, fault: str) -> None:
    """Flag ``model`` for its operator: its chat template ran past its render budget
    (``fault`` says how; the admin lists it). Idempotent; written only when it changes."""
    fault = fault[:300]
    LanguageModel.objects.filter(pk=model.pk).exclude(chat_template_fault=fault).update(
        chat_template_fault=fault
    )


def node_id_for(*, wallet: str, model_key: str, shard_start: int, shard_end: int) -> str:
    """Stable id from wallet and shard: the same shard keeps its id across restarts."""
    digest = hashlib.sha256(f"{wallet}|{model_key}|{shard_start}-{shard_end}".encode())
    return f"{wallet[:8]}-{digest.hexdigest()[:12]}"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def node_register(
    *,
    wallet: str,
    endpoint: str,
    model_key: str,
    shard_start: int,
    shard_end: int,
    num_layers: int,
    hardware: str,
    device_name: str,
    benchmark_tps: float,
    timestamp: float,
    precision: str = DEFAULT_PRECISION,
    signed_fields: Mapping[str, Any],
    signature: str,
    now: datetime,
    max_skew: float,
    gate: EndpointGate,
    max_benchmark_tps: float,
) -> Registration:
    """Register (or re-register) the node serving ``model_key`` layers ``shard_start..shard_end``.

    ``signed_fields`` is what the node sent and signed (the other arguments,
    as JSON values, under their wire names); ``timestamp`` is the signing
    time it declared. A signature is accepted once: a replayed registration
    is refused. A new node, a node coming back online and a shard change each
    bump the model's topology epoch once; a node that re-registers while
    online (a restart that kept its shard) does not.

    The endpoint is stored in its canonical form with its identity (the
    address and port it reaches), after ``gate`` admitted it and the node
    there proved (signed a fresh challenge) that it holds ``wallet`` — every
    time, before any row is written (ADR-0008). A wallet with a banned node
    is refused; so, once the proof passed, is an endpoint a banned node had,
    and one another wallet's running node serves at (compared by identity,
    so no respelling dodges either).

    Raises ``RegistrationNotTrusted``, ``UnknownModel``, ``ShardRefused``,
    ``BenchmarkRefused``, ``EndpointNotAllowed``, ``NodeBanned``,
    ``EndpointTaken`` or ``EndpointUnproven``.
    """
    if not verify_registration(wallet, signed_fields, signature):
        raise RegistrationNotTrusted(
            "Signature does not match the wallet's public key", code="invalid_signature"
        )
    skew = abs(now.timestamp() - timestamp)
    if skew > max_skew:
        raise RegistrationNotTrusted(
            f"Registration timestamp is {skew:.0f} s away from the tracker's clock "
            f"(at most {max_skew:.0f} s allowed); check the node's clock",
            code="stale_registration",
        )
    model = catalogue_model(model_key)
    check_shard(model, shard_start, shard_end, num_layers)
    check_benchmark(benchmark_tps, max_benchmark_tps)
    admitted = gate.admitted(endpoint)
    endpoint, identity = admitted.url, admitted.identity
    check_wallet_not_banned(wallet=wallet)
    # The timestamp bounds how long a captured registration could be replayed;
    # remembering each accepted signature for that long closes the window. The
    # claim is a database row: no other traffic can evict it.
    remember_until = now + timedelta(seconds=2 * max_skew + 1)
    if not claim_once("node-registration", signature, until=remember_until, now=now):
        raise RegistrationNotTrusted(
            "This signed registration was already used; sign a new one",
            code="replayed_registration",
        )
    gate.prover(endpoint=endpoint, wallet=wallet)
    # Only now, for whoever proved the endpoint: is it banned, or another wallet's?
    # Before the proof these answers would tell anyone which ports are nodes.
    check_endpoint_free(wallet=wallet, endpoint=endpoint, identity=identity)

    node_id = node_id_for(
        wallet=wallet, model_key=model.key, shard_start=shard_start, shard_end=shard_end
    )
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        # Another shard of this wallet at this endpoint means the operator
        # restarted the node with a different range: that one has left.
        replaced = (
            Node.objects.select_for_update()
            .filter(wallet=wallet, endpoint_identity=identity, status__in=SERVING)
            .exclude(pk=node_id)
        )
        existing = Node.objects.select_for_update().filter(pk=node_id).first()
        if existing is not None and existing.status == NodeStatus.BANNED:
            raise NodeBanned(node_id)
        # Again in the transaction: a ban or another wallet may have come during the proof.
        check_endpoint_free(wallet=wallet, endpoint=endpoint, identity=identity)
        replaced_ids = list(replaced.values_list("pk", flat=True))
        shard_changed = replaced.update(status=NodeStatus.OFFLINE) > 0
        was_routable = existing is not None and existing.status == NodeStatus.ONLINE
        state = {
            "wallet": wallet,
            "endpoint": endpoint,
            "endpoint_identity": identity,
            "model": model,
            "shard_start": shard_start,
            "shard_end": shard_end,
            "hardware": hardware,
            "device_name": device_name,
            "precision": precision,
            "benchmark_tps": benchmark_tps,
            "queue_depth": 0,
            "active_sessions": 0,
            "status": NodeStatus.ONLINE,
            "token_hash": token_hash(token),
            "last_heartbeat_at": now,
        }
        node, _ = Node.objects.update_or_create(
            pk=node_id, defaults=state, create_defaults={**state, "registered_at": now}
        )
        if shard_changed:
            epoch = topology_epoch_bump(model=model, reason=f"shard change: {node_id}")
        elif not was_routable:
            epoch = topology_epoch_bump(model=model, reason=f"join: {node_id}")
        else:
            epoch = topology_epoch_current(model=model)
        nodes_announce([node_id, *replaced_ids])
    return Registration(node=node, token=token, epoch=epoch)


def node_authenticate(*, node_id: str, token: str) -> Node:
    """The node whose token this is; raises ``NodeTokenInvalid`` (unknown node and wrong
    token alike)."""
    node = Node.objects.select_related("model").filter(pk=node_id).first()
    if node is None or not secrets.compare_digest(node.token_hash, token_hash(token)):
        raise NodeTokenInvalid("Unknown node or wrong node token")
    return node


def node_heartbeat(
    *,
    node: Node,
    active_sessions: int,
    queue_depth: int,
    measured_tps: float,
    prefix_cache_load: float,
    prefix_hits: int,
    now: datetime,
    gate: EndpointGate,
) -> Node:
    """Record live load and the node's prefix-cache figures. A node marked offline comes
    back online (a join) once its endpoint proves itself again through ``gate``.

    Raises ``NodeBanned`` for a banned node; ``EndpointNotAllowed`` or
    ``EndpointUnproven`` (the node stays offline) for one whose endpoint fails.
    """
    if node.status == NodeStatus.BANNED:
        raise NodeBanned(node.id)
    if node.status == NodeStatus.OFFLINE:
        # Offline may mean the periodic re-proof took it out: only a proven
        # endpoint comes back, or a heartbeat would undo the re-proof.
        admitted = gate.prove(endpoint=node.endpoint, wallet=node.wallet)
        if node.endpoint_identity and admitted.identity != node.endpoint_identity:
            # Its name reaches another socket now: bans and the one-wallet rule
            # were checked for the old one, so the node registers again.
            raise EndpointNotAllowed(
                f"Endpoint {node.endpoint} now reaches {admitted.identity}, not "
                f"{node.endpoint_identity}: register the node again"
            )
    with transaction.atomic():
        rejoined = (
            Node.objects.filter(pk=node.pk, status=NodeStatus.OFFLINE).update(
                status=NodeStatus.ONLINE
            )
            > 0
        )
        Node.objects.filter(pk=node.pk).update(
            active_sessions=active_sessions,
            queue_depth=queue_depth,
            measured_tps=measured_tps,
            prefix_cache_load=prefix_cache_load,
            prefix_hits=prefix_hits,
            last_heartbeat_at=now,
        )
        if rejoined:
            topology_epoch_bump(model=node.model, reason=f"join: {node.id}")
    visible = rejoined or (node.active_sessions, node.queue_depth, node.prefix_cache_load) != (
        active_sessions,
        queue_depth,
        prefix_cache_load,
    )
    node.refresh_from_db()
    node_heartbeat_announce(node, visible_change=visible)
    return node


def node_deregister(*, node: Node) -> None:
    """The node leaves cleanly (SIGTERM): offline now, epoch bumped once."""
    with transaction.atomic():
        _, left_routing = nodes_take_offline(Node.objects.filter(pk=node.pk))
        if left_routing:
            topology_epoch_bump(model=node.model, reason=f"leave: {node.id}")
        nodes_announce([node.pk])


def nodes_sweep_stale(*, now: datetime, timeout_seconds: float) -> list[str]:
    """Mark serving nodes silent for longer than the timeout offline.

    Returns the ids marked. Each model whose topology changed gets one epoch
    bump. The conditional update makes concurrent sweeps safe: a node is only
    counted by the sweep whose update changed its row.
    """
    cutoff = now - timedelta(seconds=timeout_seconds)
    swept: list[str] = []
    bumped: set[int] = set()
    candidates = Node.objects.filter(status__in=SERVING, last_heartbeat_at__lt=cutoff)
    for node in candidates.select_related("model"):
        with transaction.atomic():
            still_silent = Node.objects.filter(pk=node.pk, last_heartbeat_at__lt=cutoff)
            changed, left_routing = nodes_take_offline(still_silent)
            if not changed:
                continue  # a heartbeat or another sweep got there first
            swept.append(node.pk)
            if left_routing and node.model_id not in bumped:
                topology_epoch_bump(model=node.model, reason=f"liveness sweep: {node.id}")
                bumped.add(node.model_id)
    nodes_announce(swept)
    return swept


def nodes_take_offline(nodes: QuerySet[Node]) -> tuple[bool, bool]:
    """Mark the still-running ``nodes`` offline.

    Returns (whether any row changed, whether a routable node left routing).
    """
    online = nodes.filter(status=NodeStatus.ONLINE).update(status=NodeStatus.OFFLINE)
    draining = nodes.filter(status=NodeStatus.DRAINING).update(status=NodeStatus.OFFLINE)
    return online + draining > 0, online > 0


def node_set_status(*, node: Node, new_status: NodeStatus) -> bool:
    """Operator action (drain, ban, unban). Bumps the epoch when routing membership changes.

    Draining nodes finish what they run but take no new routes; banned nodes
    take none and may not register again until unbanned (back to offline, so
    they rejoin with their next heartbeat or registration).
    """
    with transaction.atomic():
        current = Node.objects.select_for_update().get(pk=node.pk)
        if current.status == new_status:
            return False
        was_routable = current.status == NodeStatus.ONLINE
        current.status = new_status
        current.save(update_fields=["status"])
        if was_routable != (new_status == NodeStatus.ONLINE):
            topology_epoch_bump(model=current.model, reason=f"{new_status}: {node.id}")
        nodes_announce([node.pk])
    return True
