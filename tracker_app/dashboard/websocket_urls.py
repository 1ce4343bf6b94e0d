"""Websocket routes of the tracker (the dashboard's live events)."""

from django.urls import URLPattern, path

from tracker_app.dashboard.consumer import DashboardConsumer

websocket_urlpatterns: list[URLPattern] = [
    path("ws/dashboard/", DashboardConsumer.as_asgi()),
]
