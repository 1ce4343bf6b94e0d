"""The OpenAI-compatible read endpoints of the tracker."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from routing_app.selectors import language_models_served


class ModelsApi(APIView):
    """``GET /v1/models``: the models a complete route can serve right now."""

    class Output(serializers.Serializer[dict[str, Any]]):
        id = serializers.CharField()
        object = serializers.CharField()
        created = serializers.IntegerField()
        owned_by = serializers.CharField()
        meshnet = serializers.DictField()

    @extend_schema(responses={200: Output(many=True)})
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
        return Response({"object": "list", "data": data})
