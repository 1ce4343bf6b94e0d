"""What a registration must pass besides its signature: the catalogue, the shard, the
speed claim, and who may serve at an endpoint (bans, one wallet per endpoint).

Endpoints are compared by identity (``nodes_app.endpoints.AdmittedEndpoint``:
the address and port a connection reaches), never by spelling, so neither a
ban nor another wallet's running node can be dodged by writing ``localhost``
for ``127.0.0.1`` (ADR-0008).
"""

from __future__ import annotations

from django.db.models import Q

from meshnet_site.errors import DomainError, ErrorKind
from nodes_app.models import LanguageModel, Node, NodeStatus
from nodes_app.selectors import ModelNotFound, language_model_get, language_model_keys

# Statuses of a node that still runs. Only ONLINE nodes take part in routing,
# so only an ONLINE node's departure changes the topology (a draining node
# already left it when it started draining).
SERVING = (NodeStatus.ONLINE, NodeStatus.DRAINING)


class NodeBanned(DomainError):
    """The operator banned this node: it may neither register nor heartbeat.

    The ban follows the node's wallet and endpoint: neither registers again,
    under another shard or another wallet (``because`` says which matched).
    """

    kind = ErrorKind.FORBIDDEN
    code = "node_banned"

    def __init__(self, node_id: str, because: str = "") -> None:
        super().__init__(f"Node {node_id} is banned by the tracker's operator{because}")


class EndpointTaken(DomainError):
    """Another wallet's running node serves at this endpoint."""

    kind = ErrorKind.CONFLICT
    code = "endpoint_taken"


class BenchmarkRefused(DomainError):
    """A node claimed a start-up speed above what the tracker accepts."""

    kind = ErrorKind.INVALID
    code = "benchmark_out_of_range"


class UnknownModel(DomainError):
    """A node announced a model the tracker's catalogue does not hold."""

    kind = ErrorKind.INVALID
    code = "unknown_model"


class ShardRefused(DomainError):
    """A node's shard does not fit its model: ``layer_count_mismatch`` or
    ``layers_out_of_range``."""

    kind = ErrorKind.INVALID


def check_wallet_not_banned(*, wallet: str) -> None:
    """Refuse a wallet with a banned node (it learns only about itself)."""
    banned = Node.objects.filter(status=NodeStatus.BANNED, wallet=wallet).order_by("pk").first()
    if banned is not None:
        raise NodeBanned(banned.pk, " (this wallet's)")


def check_endpoint_free(*, wallet: str, endpoint: str, identity: str) -> None:
    """Refuse an endpoint a ban follows, and one another wallet's node runs at.

    Called only once the registrant proved the endpoint: what these refusals
    tell (a banned node was there, another wallet runs there) is for the one
    who serves at it, not for anyone mapping the tracker's reach.
    """
    banned = (
        Node.objects.filter(status=NodeStatus.BANNED)
        .filter(Q(wallet=wallet) | Q(endpoint_identity=identity))
        .order_by("pk")
        .first()
    )
    if banned is not None:
        because = " (this wallet's)" if banned.wallet == wallet else f" (it served at {endpoint})"
        raise NodeBanned(banned.pk, because)
    taken = Node.objects.filter(endpoint_identity=identity, status__in=SERVING)
    if taken.exclude(wallet=wallet).exists():
        raise EndpointTaken(
            f"Endpoint {endpoint} is served by another wallet's running node; "
            "an endpoint belongs to one wallet at a time"
        )


def check_benchmark(benchmark_tps: float, max_benchmark_tps: float) -> None:
    if not 0.0 <= benchmark_tps <= max_benchmark_tps:  # also refuses NaN
        raise BenchmarkRefused(
            f"benchmark_tps {benchmark_tps} is above the {max_benchmark_tps:g} tokens/s "
            "this tracker accepts"
        )


def catalogue_model(key: str) -> LanguageModel:
    try:
        return language_model_get(key=key)
    except ModelNotFound:
        known = ", ".join(language_model_keys()) or "none"
        raise UnknownModel(
            f"Model {key!r} is not in the tracker's catalogue (known: {known})"
        ) from None


def check_shard(model: LanguageModel, start: int, end: int, num_layers: int) -> None:
    if num_layers != model.num_layers:
        raise ShardRefused(
            f"Node declares {num_layers} layers for {model.key}, "
            f"but the catalogue says {model.num_layers}",
            code="layer_count_mismatch",
        )
    if not 0 <= start <= end <= model.last_layer:
        raise ShardRefused(
            f"Layers {start}-{end} are outside {model.key}'s layers 0-{model.last_layer}",
            code="layers_out_of_range",
        )
