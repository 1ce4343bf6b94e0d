"""Node registry API: one view per operation, each validating input and calling a service."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from meshnet_site.api_schema import NODE_TOKEN, body_error_responses, error_responses, security
from meshnet_site.bearer import bearer_token
from meshnet_site.parsers import JSONParser
from nodes_app import services
from nodes_app.endpoints import EndpointGate
from nodes_app.models import LanguageModel, Node
from nodes_app.plans import tracker_public_key
from nodes_app.protocol.limits import TRACKER_KEY_ALGORITHM
from nodes_app.protocol.registration import (
    DEFAULT_PRECISION,
    MAX_LAYERS,
    MAX_REPORTED_PREFIX_HITS,
    MAX_REPORTED_QUEUE_DEPTH,
    MAX_REPORTED_SESSIONS,
    MAX_REPORTED_TPS,
    PRECISIONS,
)
from nodes_app.registration_limit import registration_rate_limit_check

HARDWARE = ("cpu", "cuda", "mps")

# Nodes speak JSON: a registration's signature covers its fields as JSON values,
# and daphne refuses a malformed multipart body itself, with a bare 400 that is
# not the documented error (found by schemathesis). Anything else is a 415.
NODE_PARSERS = [JSONParser]


def _authenticated_node(request: Request, node_id: str) -> Node:
    """The node of the path whose token the request carries, or ``NodeTokenInvalid``."""
    token = bearer_token(request.headers.get("Authorization", ""))
    if token is None:
        raise services.NodeTokenInvalid(
            "Missing node token: send 'Authorization: Bearer <node token>'",
            code="missing_node_token",
        )
    if "\x00" in node_id:
        # No node has such an id, and PostgreSQL cannot even compare one (a 500).
        raise services.NodeTokenInvalid("Unknown node or wrong node token")
    return services.node_authenticate(node_id=node_id, token=token)


@extend_schema_serializer(component_name="Node")
class NodeOutput(serializers.ModelSerializer[Node]):
    model: serializers.SlugRelatedField[LanguageModel] = serializers.SlugRelatedField(
        slug_field="key", read_only=True
    )

    class Meta:
        model = Node
        fields = [
            "id",
            "wallet",
            "endpoint",
            "model",
            "shard_start",
            "shard_end",
            "hardware",
            "device_name",
            "precision",
            "benchmark_tps",
            "measured_tps",
            "queue_depth",
            "active_sessions",
            "prefix_cache_load",
            "prefix_hits",
            "reputation",
            "status",
            "registered_at",
            "last_heartbeat_at",
        ]


@extend_schema_serializer(component_name="DraftModelNamed")
class DraftModelOutput(serializers.Serializer[LanguageModel]):
    key = serializers.SlugField()
    weight_source = serializers.CharField(
        help_text="Where the tracker reads its weights; a node may load them from elsewhere "
        "(runnode --draft-weights)"
    )


class RegisterNodeApi(APIView):
    """A node announces the shard it serves, signed with its wallet key."""

    parser_classes = NODE_PARSERS

    @extend_schema_serializer(component_name="NodeRegistration")
    class Input(serializers.Serializer[dict[str, Any]]):
        wallet = serializers.RegexField(r"^[0-9a-f]{64}$", help_text="ed25519 public key, hex")
        endpoint = serializers.URLField(max_length=300)
        model = serializers.SlugField(max_length=64)
        shard_start = serializers.IntegerField(min_value=0, max_value=MAX_LAYERS - 1)
        shard_end = serializers.IntegerField(
            min_value=0, max_value=MAX_LAYERS - 1, help_text="At least shard_start"
        )
        num_layers = serializers.IntegerField(min_value=1, max_value=MAX_LAYERS)
        hardware = serializers.ChoiceField(choices=HARDWARE)
        device_name = serializers.CharField(max_length=200, allow_blank=True, default="")
        # Nodes older than the field compute in float32 and do not send it.
        precision = serializers.ChoiceField(choices=PRECISIONS, default=DEFAULT_PRECISION)
        # Its upper bound is the service's (MESHNET_NODE_MAX_BENCHMARK_TPS,
        # refused as benchmark_out_of_range), the one rule for a speed claim.
        benchmark_tps = serializers.FloatField(min_value=0.0)
        timestamp = serializers.FloatField(help_text="Unix time of signing")
        signature = serializers.RegexField(r"^[0-9a-f]{128}$", help_text="ed25519, hex")

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            if attrs["shard_end"] < attrs["shard_start"]:
                raise serializers.ValidationError(
                    {"shard_end": "must not be smaller than shard_start"}
                )
            return attrs

    @extend_schema_serializer(component_name="NodeRegistered")
    class Output(serializers.Serializer[dict[str, Any]]):
        node_id = serializers.CharField()
        node_token = serializers.CharField()
        epoch = serializers.IntegerField()
        heartbeat_interval = serializers.FloatField()
        node = NodeOutput()
        draft = DraftModelOutput(
            allow_null=True,
            help_text="The model's draft model (same tokenizer), which a head (a node starting "
            "at layer 0) runs whole to guess the next tokens (ADR-0028); null: none",
        )

    @extend_schema(
        description="No credential: the body is signed by the node's wallet key (``signature`` "
        "over every other field, see nodes_app.shared.signing), and the endpoint must answer the "
        "tracker's challenge for that wallet before anything is written. An endpoint is a "
        "scheme, host and port (no path), compared by the address and port it reaches.",
        auth=[],
        request=Input,
        responses={
            201: Output,
            **body_error_responses(
                e400="invalid_request, unknown_model, layer_count_mismatch, "
                "layers_out_of_range, benchmark_out_of_range, endpoint_not_allowed",
                e401="invalid_signature, stale_registration, replayed_registration",
                e403="node_banned, endpoint_unproven (one refusal for every failed proof)",
                e409="endpoint_taken (told only to a registrant that proved the endpoint)",
                e429="registration_rate_limited",
            ),
        },
    )
    def post(self, request: Request) -> Response:
        now = timezone.now()
        # Counted first, before parsing or any signature work: a flood of
        # registrations, valid or not, costs the tracker one counter each.
        registration_rate_limit_check(
            client_address=request.META.get("REMOTE_ADDR", ""),
            limit=settings.MESHNET_REGISTRATION_RATE_LIMIT,
            now=now,
        )
        data = self.Input(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        registration = services.node_register(
            wallet=fields["wallet"],
            endpoint=fields["endpoint"],
            model_key=fields["model"],
            shard_start=fields["shard_start"],
            shard_end=fields["shard_end"],
            num_layers=fields["num_layers"],
            hardware=fields["hardware"],
            device_name=fields["device_name"],
            precision=fields["precision"],
            benchmark_tps=fields["benchmark_tps"],
            timestamp=fields["timestamp"],
            # The signature covers the fields exactly as the node sent them.
            signed_fields={k: v for k, v in request.data.items() if k != "signature"},
            signature=fields["signature"],
            now=now,
            max_skew=settings.MESHNET_REGISTRATION_MAX_SKEW,
            gate=EndpointGate(networks=settings.MESHNET_NODE_NETWORKS),
            max_benchmark_tps=settings.MESHNET_NODE_MAX_BENCHMARK_TPS,
        )
        body = self.Output(
            {
                "node_id": registration.node.id,
                "node_token": registration.token,
                "epoch": registration.epoch,
                "heartbeat_interval": settings.MESHNET_NODE_HEARTBEAT_INTERVAL,
                "node": registration.node,
                "draft": registration.node.model.draft,
            }
        ).data
        return Response(body, status=status.HTTP_201_CREATED)


class HeartbeatNodeApi(APIView):
    """A node reports that it is alive and how loaded it is."""

    parser_classes = NODE_PARSERS

    @extend_schema_serializer(component_name="NodeHeartbeat")
    class Input(serializers.Serializer[dict[str, Any]]):
        # Bounded far above any real node and far below any column's overflow.
        active_sessions = serializers.IntegerField(min_value=0, max_value=MAX_REPORTED_SESSIONS)
        queue_depth = serializers.IntegerField(min_value=0, max_value=MAX_REPORTED_QUEUE_DEPTH)
        measured_tps = serializers.FloatField(
            min_value=0.0, max_value=MAX_REPORTED_TPS, default=0.0
        )
        # The prefix cache (ADR-0027) as the node's open health page shows it; nodes
        # older than the cache do not send them.
        prefix_cache_load = serializers.FloatField(
            min_value=0.0,
            max_value=1.0,
            default=0.0,
            help_text="Share of the node's KV budget its prefix cache holds, rounded up to a "
            "quarter",
        )
        prefix_hits = serializers.IntegerField(
            min_value=0,
            max_value=MAX_REPORTED_PREFIX_HITS,
            default=0,
            help_text="Prefix-cache hits since the node started",
        )

    @extend_schema(
        auth=security(NODE_TOKEN),
        request=Input,
        responses={
            200: NodeOutput,
            **body_error_responses(
                e400="invalid_request, endpoint_not_allowed",
                e401="missing_node_token, invalid_node_token",
                e403="node_banned, endpoint_unproven (an offline node's endpoint must prove "
                "itself again)",
            ),
        },
    )
    def post(self, request: Request, node_id: str) -> Response:
        node = _authenticated_node(request, node_id)
        data = self.Input(data=request.data)
        data.is_valid(raise_exception=True)
        node = services.node_heartbeat(
            node=node,
            now=timezone.now(),
            gate=EndpointGate(networks=settings.MESHNET_NODE_NETWORKS),
            **data.validated_data,
        )
        return Response(NodeOutput(node).data)


class DeregisterNodeApi(APIView):
    """A node leaves the network (it is shutting down)."""

    @extend_schema(
        auth=security(NODE_TOKEN),
        request=None,
        responses={
            204: None,
            **error_responses(e401="missing_node_token, invalid_node_token"),
        },
    )
    def post(self, request: Request, node_id: str) -> Response:
        node = _authenticated_node(request, node_id)
        services.node_deregister(node=node)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TrackerKeyApi(APIView):
    """The key this tracker signs plans with; nodes fetch and pin it when they register."""

    @extend_schema_serializer(component_name="TrackerKey")
    class Output(serializers.Serializer[dict[str, Any]]):
        algorithm = serializers.CharField()
        public_key = serializers.RegexField(r"^[0-9a-f]{64}$", help_text="ed25519 public key, hex")

    @extend_schema(auth=[], responses={200: Output})
    def get(self, request: Request) -> Response:
        body = {"algorithm": TRACKER_KEY_ALGORITHM, "public_key": tracker_public_key()}
        return Response(self.Output(body).data)
