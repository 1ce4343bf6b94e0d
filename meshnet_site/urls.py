"""Tracker URLs: admin, node registry API, OpenAPI schema, health and metrics."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from tracker_app import api as tracker_api
from tracker_app import views as tracker_views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/nodes/", include("nodes_app.urls")),
    path("v1/", include("routing_app.urls")),
    path("v1/models", tracker_api.ModelsApi.as_view(), name="models"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("healthz", tracker_views.healthz, name="healthz"),
    path("", include("django_prometheus.urls")),
]
