"""Routing's HTTP API: ``GET /v1/routing`` and the placement endpoints (ADR-0019).

``GET /v1/routing`` is the learned routing table, read-only, for clients and
staff. Anonymous callers are refused (401). A client with an API key sees the
table without node endpoints; staff (a dashboard session) see the endpoints
too: addresses of node operators' machines are nobody else's business. Which
credentials count is the composition root's choice (``meshnet_site.urls``
passes the tracker's API-key authenticator and Django's session).

``GET /v1/placement?model=KEY[&layers=N]`` (an API key or a staff session, as
``/v1/routing``) shows a model's stages, their capacity, the layers nobody
serves and the range a new node would be offered. ``GET
/api/nodes/placement?model=KEY&layers=N`` answers a node that is about to
join (``runnode --layers auto``) with that offer alone: registration needs
no account, so neither does asking where to register. Both read the same
plan (``selectors.model_placement``) and place by
``routing_app.planning.placement``.
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
from nodes_app.selectors import language_model_get
from routing_app.learning.arms import ArmStatus
from routing_app.learning.tracker_store import route_stats_store
from routing_app.planning.placement import Offer, PlacementRule, place
from routing_app.policies.config import RoutePolicyConfig
from routing_app.selectors import model_placement, routing_table
from routing_app.services import placement_rate_limit_check

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
    prompt_token_seconds = serializers.FloatField(
        allow_null=True,
        help_text="Seconds a prompt token takes to compute on the route, as this tracker "
        "learned it (its model's routes' until the route has its own): what a cached prefix "
        "saves, weighed by cache-aware routing",
    )
    answer_token_seconds = serializers.FloatField(
        allow_null=True,
        help_text="Seconds an answer token takes after the first on the route, learned alike",
    )
    drafted_per_token = serializers.FloatField(
        allow_null=True,
        help_text="Speculation: drafts the route's head sent per answer token (ADR-0028)",
    )
    accepted_per_token = serializers.FloatField(
        allow_null=True,
        help_text="Speculation: drafts the route's last hop accepted per answer token: the "
        "share of answer tokens that cost no round trip of their own",
    )


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
            config=RoutePolicyConfig.from_settings(),
        )
        if not is_staff(request):
            for model in table["models"]:
                for route in model["routes"]:
                    for hop in route["hops"]:
                        hop.pop("endpoint", None)
        return Response(self.Output(table).data)


# The most layers a node may say it holds (a bound for the query, not a model's size).
MAX_HELD_LAYERS = 100_000
# The offer's rules as the schema names them (PlacementRuleEnum).
PLACEMENT_RULES = [str(rule) for rule in PlacementRule]


class PlacementQuery(serializers.Serializer[dict[str, Any]]):
    model = serializers.SlugField(max_length=64, help_text="The catalogue key")
    layers = serializers.IntegerField(
        min_value=0,
        max_value=MAX_HELD_LAYERS,
        required=False,
        help_text="How many decoder layers the new node holds (weights plus its KV budget); "
        "absent: as many as offered. 0 is refused as node_too_small",
    )


@extend_schema_serializer(component_name="PlacementOffer")
class OfferOutput(serializers.Serializer[dict[str, Any]]):
    start_layer = serializers.IntegerField()
    end_layer = serializers.IntegerField()
    rule = serializers.ChoiceField(
        choices=PLACEMENT_RULES,
        help_text="uncovered: layers no node serves; least_capacity: the weakest stage",
    )
    reason = serializers.CharField(help_text="Why this range, in a sentence")


@extend_schema_serializer(component_name="PlacementStage")
class StageOutput(serializers.Serializer[dict[str, Any]]):
    start_layer = serializers.IntegerField()
    end_layer = serializers.IntegerField()
    node_ids = serializers.ListField(child=serializers.CharField())
    node_count = serializers.IntegerField()
    capacity_tps = serializers.FloatField(
        help_text="Sum of the stage's online nodes' tokens/s (benchmark capped by measured; "
        "no node faster than the fastest measured route runs a layer)"
    )


@extend_schema_serializer(component_name="LayerRange")
class RangeOutput(serializers.Serializer[dict[str, Any]]):
    start_layer = serializers.IntegerField()
    end_layer = serializers.IntegerField()


def offer_dict(offer: Offer) -> dict[str, Any]:
    return {
        "start_layer": offer.start_layer,
        "end_layer": offer.end_layer,
        "rule": str(offer.rule),
        "reason": offer.reason,
    }


ERRORS = error_responses(
    e400="invalid_request (no model, a model that is not a slug, layers not an integer); "
    "node_too_small (layers=0)",
    e404="model_not_found",
)


class PlacementApi(APIView):
    """A model's placement plan: stages, their capacity, gaps and a new node's offer."""

    permission_classes = [ClientOrStaff]

    @extend_schema_serializer(component_name="Placement")
    class Output(serializers.Serializer[dict[str, Any]]):
        model = serializers.CharField()
        num_layers = serializers.IntegerField()
        stages = StageOutput(many=True)
        uncovered = RangeOutput(many=True, help_text="Layer ranges no online node serves")
        layers = serializers.IntegerField(
            allow_null=True, help_text="The layers the offer was sized for (the query's)"
        )
        offer = OfferOutput(help_text="The range a new node holding `layers` layers is given")

    @extend_schema(
        parameters=[PlacementQuery],
        responses={
            200: Output,
            **ERRORS,
            **error_responses(
                e401="invalid_api_key (none sent, or a wrong or revoked one)",
                e403="staff_only (a signed-in account that is not staff)",
            ),
        },
    )
    def get(self, request: Request) -> Response:
        query = PlacementQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        model = language_model_get(key=query.validated_data["model"])
        layers = query.validated_data.get("layers")
        plan = model_placement(model)
        body = {
            "model": model.key,
            "num_layers": plan.num_layers,
            "stages": [
                {
                    "start_layer": stage.start_layer,
                    "end_layer": stage.end_layer,
                    "node_ids": list(stage.node_ids),
                    "node_count": len(stage.node_ids),
                    "capacity_tps": stage.capacity_tps,
                }
                for stage in plan.stages
            ],
            "uncovered": [{"start_layer": a, "end_layer": b} for a, b in plan.uncovered],
            "layers": layers,
            "offer": offer_dict(place(plan, max_layers=layers)),
        }
        return Response(self.Output(body).data)


class NodePlacementApi(APIView):
    """The range a node about to join should serve (``runnode --layers auto``)."""

    @extend_schema_serializer(component_name="NodePlacement")
    class Output(OfferOutput):
        model = serializers.CharField()
        num_layers = serializers.IntegerField()

    @extend_schema(
        description="No credential, as registration needs none: only the offer is shown "
        "(GET /v1/placement has the whole plan).",
        auth=[],
        parameters=[PlacementQuery],
        responses={
            200: Output,
            **ERRORS,
            **error_responses(e429="placement_rate_limited (per client address, per minute)"),
        },
    )
    def get(self, request: Request) -> Response:
        placement_rate_limit_check(client_address=request.META.get("REMOTE_ADDR", ""))
        query = PlacementQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        model = language_model_get(key=query.validated_data["model"])
        offer = place(model_placement(model), max_layers=query.validated_data.get("layers"))
        body = {"model": model.key, "num_layers": model.num_layers, **offer_dict(offer)}
        return Response(self.Output(body).data)
