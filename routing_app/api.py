"""``GET /v1/routing``: the learned routing table, read-only, for clients and staff.

Anonymous callers are refused (401). A client with an API key sees the table
without node endpoints; staff (a dashboard session) see the endpoints too:
addresses of node operators' machines are nobody else's business. Which
credentials count is the composition root's choice (``meshnet_site.urls``
passes the tracker's API-key authenticator and Django's session).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from meshnet_site.api_schema import error_responses
from meshnet_site.environment import ROUTE_POLICY
from meshnet_site.errors import DomainError, ErrorKind
from routing_app.arms import ArmStatus
from routing_app.config import RoutingConfig
from routing_app.table import routing_table
from routing_app.tracker_store import route_stats_store

# The schema names this enum (ENUM_NAME_OVERRIDES); a node's status is another.
ROUTE_STATUSES = [str(s) for s in ArmStatus]


@extend_schema_serializer(component_name="RouteHop")
class HopOutput(serializers.Serializer[dict[str, Any]]):
    node_id = serializers.CharField()
    endpoint = serializers.CharField(required=False, help_text="/v1/routing shows it to staff only")
    start_layer = serializers.IntegerField()
    end_layer = serializers.IntegerField()


@extend_schema_serializer(component_name="Route")
class RouteOutput(serializers.Serializer[dict[str, Any]]):
    signature = serializers.CharField()
    hops = HopOutput(many=True)
    prior_tps = serializers.FloatField()
    tps = serializers.FloatField(allow_null=True, help_text="Learned end-to-end tokens/s")
    coefficient = serializers.FloatField(allow_null=True, help_text="tps ÷ best proven tps")
    expected_share = serializers.FloatField(
        help_text="Share of traffic under the policy (a due one-off scout left out)"
    )
    scout_due = serializers.BooleanField(
        help_text="thompson-load: the next request goes here once, to measure it"
    )
    samples = serializers.IntegerField()
    weight = serializers.FloatField(help_text="Decayed sample mass")
    status = serializers.ChoiceField(choices=ROUTE_STATUSES)


@extend_schema_serializer(component_name="ModelRouting")
class ModelRoutingOutput(serializers.Serializer[dict[str, Any]]):
    model = serializers.CharField()
    epoch = serializers.IntegerField()
    sample_spread = serializers.FloatField(
        help_text="How far one request's speed strays from its route's (spread of ln tok/s), "
        "learned from this tracker's samples"
    )
    routes = RouteOutput(many=True)


@extend_schema_serializer(component_name="RoutingConfig")
class ConfigOutput(serializers.Serializer[dict[str, Any]]):
    policy = serializers.ChoiceField(
        choices=list(ROUTE_POLICY.choices), help_text="The route choice policy (ADR-0011)"
    )
    explore_share = serializers.FloatField(help_text="adr0021: share of requests that scout")
    weight_alpha = serializers.FloatField(help_text="adr0021: exploit P ∝ tps^alpha")
    stats_half_life = serializers.FloatField()
    min_sample_tokens = serializers.IntegerField()
    max_unsampled_seconds = serializers.FloatField(
        help_text=(
            "thompson-load: a candidate unmeasured for 95 % of this takes the next request "
            "once nothing is in flight on it"
        )
    )
    load_exponent = serializers.FloatField(
        help_text="thompson-load: score lowered by load_exponent × ln(1 + sessions in flight)"
    )


class CredentialsRequired(DomainError):
    kind = ErrorKind.UNAUTHENTICATED
    code = "invalid_api_key"


class StaffOnly(DomainError):
    kind = ErrorKind.FORBIDDEN
    code = "staff_only"


def is_staff(request: Request) -> bool:
    user = request.user
    return bool(user is not None and user.is_active and user.is_staff)


class ClientOrStaff(BasePermission):
    """An authenticated client (``request.auth``: an API key) or a staff user."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.auth is not None or is_staff(request):
            return True
        if request.user is not None and request.user.is_authenticated:
            raise StaffOnly("Only staff accounts or API keys may read the routing table")
        raise CredentialsRequired(
            "Missing API key: send 'Authorization: Bearer <key>' (or sign in as staff)"
        )


class RoutingTableApi(APIView):
    """Per model: topology epoch and every candidate route with what was learned about it."""

    permission_classes = [ClientOrStaff]

    class Query(serializers.Serializer[dict[str, Any]]):
        # A catalogue key is a slug; anything else (a NUL byte, which PostgreSQL cannot
        # even compare, answered 500; found by schemathesis) is refused as invalid.
        model = serializers.SlugField(
            max_length=64, required=False, allow_blank=True, help_text="Only this model's table"
        )

    @extend_schema_serializer(component_name="RoutingTable")
    class Output(serializers.Serializer[dict[str, Any]]):
        config = ConfigOutput()
        models = ModelRoutingOutput(many=True)

    @extend_schema(
        parameters=[Query],
        responses={
            200: Output,
            **error_responses(
                e400="invalid_request (a model that is not a slug)",
                e401="invalid_api_key (none sent, or a wrong or revoked one)",
                e403="staff_only (a signed-in account that is not staff)",
                e404="model_not_found",
            ),
        },
    )
    def get(self, request: Request) -> Response:
        query = self.Query(data=request.query_params)
        query.is_valid(raise_exception=True)
        table = routing_table(
            model_key=query.validated_data.get("model") or None,
            store=route_stats_store(),
            config=RoutingConfig.from_settings(),
        )
        if not is_staff(request):
            for model in table["models"]:
                for route in model["routes"]:
                    for hop in route["hops"]:
                        hop.pop("endpoint", None)
        return Response(self.Output(table).data)
