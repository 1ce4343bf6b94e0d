"""The OpenAI-compatible read endpoints of the tracker."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from meshnet_site.api_schema import constant
from routing_app.selectors import language_models_served


@extend_schema_serializer(component_name="ModelDetails")
class ModelDetailsOutput(serializers.Serializer[dict[str, Any]]):
    display_name = serializers.CharField()
    num_layers = serializers.IntegerField()


@extend_schema_serializer(component_name="Model")
class ModelOutput(serializers.Serializer[dict[str, Any]]):
    id = serializers.CharField()
    object = constant("model")
    created = serializers.IntegerField()
    owned_by = serializers.CharField()
    meshnet = ModelDetailsOutput()


class ModelsApi(APIView):
    """``GET /v1/models``: the models a complete route can serve right now."""

    @extend_schema_serializer(component_name="ModelList")
    class Output(serializers.Serializer[dict[str, Any]]):
        object = constant("list")
        # OpenAI's key; DRF's metaclass takes declared fields off the class, so the
        # serializer's own ``.data`` stays as it is.
        data = ModelOutput(many=True)  # type: ignore[assignment]

    @extend_schema(auth=[], responses={200: Output})
    def get(self, request: Request) -> Response:
        data = [
            {
                "id": model.key,
                "object": "model",
                "created": int(model.created_at.timestamp()),
                "owned_by": "meshnet",
                "meshnet": {"display_name": model.display_name, "num_layers": model.num_layers},
            }
            for model in language_models_served()
        ]
        return Response(self.Output({"object": "list", "data": data}).data)
