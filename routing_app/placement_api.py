"""Placement (ADR-0019): the plan for staff and clients, the offer for a joining node.

``GET /v1/placement?model=KEY[&layers=N]`` (an API key or a staff session, as
``/v1/routing``) shows a model's stages, their capacity, the layers nobody
serves and the range a new node would be offered. ``GET
/api/nodes/placement?model=KEY&layers=N`` answers a node that is about to
join (``runnode --layers auto``) with that offer alone: registration needs
no account, so neither does asking where to register. Both read the same
plan through :func:`model_placement` and place by ``routing_app.placement``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from meshnet_site.api_schema import error_responses
from meshnet_site.errors import DomainError, ErrorKind
from meshnet_site.guards.services import count_hit, window_retry_after
from nodes_app.models import LanguageModel
from nodes_app.registration_limit import WINDOW_SECONDS, client_network
from nodes_app.selectors import language_model_get, topology_epoch_current
from routing_app.api import ClientOrStaff
from routing_app.arms import ArmView
from routing_app.placement import Offer, PlacementPlan, PlacementRule, place, placement_plan
from routing_app.selectors import routing_nodes
from routing_app.services import route_candidates
from routing_app.tracker_store import route_stats_store

# The most layers a node may say it holds (a bound for the query, not a model's size).
MAX_HELD_LAYERS = 100_000
# The offer's rules as the schema names them (PlacementRuleEnum).
PLACEMENT_RULES = [str(rule) for rule in PlacementRule]


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


def model_placement(model: LanguageModel) -> PlacementPlan:
    """The model's stages as its online nodes cover them now, their claimed speeds floored
    by the routes this tracker measured (as routing floors them: SECURITY §9)."""
    nodes = routing_nodes(model=model)
    arms: list[ArmView] = []
    if nodes:
        store = route_stats_store()
        plans = route_candidates(model=model, store=store)
        arms = store.views(plans=plans, epoch=topology_epoch_current(model=model))
    return placement_plan(nodes, model.num_layers, arms)


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
