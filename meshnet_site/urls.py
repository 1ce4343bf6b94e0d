"""Tracker URLs: dashboard, admin, node registry API, the plan-signing key, OpenAPI
schema, health and metrics. (The completion endpoints are Channels consumers:
``meshnet_site.asgi``.)"""

from django.contrib import admin
from django.contrib.auth.views import LogoutView
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView
from rest_framework.authentication import SessionAuthentication

from routing_app.api import NodePlacementApi, PlacementApi, RoutingTableApi
from tracker_app import api as tracker_api
from tracker_app import views as tracker_views
from tracker_app.api_keys.authentication import ApiKeyAuthentication
from tracker_app.dashboard import views as dashboard_views

# Clients read with the API key they chat with; staff with their dashboard session.
CLIENT_OR_STAFF = [ApiKeyAuthentication, SessionAuthentication]

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="dashboard"), name="home"),
    path("dashboard/", dashboard_views.dashboard_page, name="dashboard"),
    path("dashboard/login/", dashboard_views.DashboardLoginView.as_view(), name="dashboard-login"),
    path(
        "dashboard/logout/",
        LogoutView.as_view(next_page="dashboard-login"),
        name="dashboard-logout",
    ),
    path("admin/", admin.site.urls),
    # Before nodes_app's "<node_id>/…" paths: asked by a node about to join (ADR-0019).
    path("api/nodes/placement", NodePlacementApi.as_view(), name="node-placement"),
    path("api/nodes/", include("nodes_app.urls")),
    path(
        "v1/routing",
        RoutingTableApi.as_view(authentication_classes=CLIENT_OR_STAFF),
        name="routing-table",
    ),
    path(
        "v1/placement",
        PlacementApi.as_view(authentication_classes=CLIENT_OR_STAFF),
        name="placement",
    ),
    path(".well-known/", include("nodes_app.well_known_urls")),
    path("v1/models", tracker_api.ModelsApi.as_view(), name="models"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("healthz", tracker_views.healthz, name="healthz"),
    path("metrics", tracker_views.metrics, name="prometheus-django-metrics"),
    # Last: any other path of the OpenAI API is a JSON 404, as OpenAI's clients expect.
    re_path(r"^v1/", tracker_views.api_not_found, name="api-not-found"),
]
