"""Routing endpoints under /v1/."""

from django.urls import path

from routing_app.api import RoutingTableApi

urlpatterns = [
    path("routing", RoutingTableApi.as_view(), name="routing-table"),
]
