"""Websocket routes of the tracker (the dashboard's live events)."""

from django.urls import URLPattern

websocket_urlpatterns: list[URLPattern] = []
