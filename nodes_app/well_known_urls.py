"""``/.well-known/``: what a tracker publishes to anyone (``protocol.limits.TRACKER_KEY_PATH``)."""

from django.urls import path

from nodes_app import api

urlpatterns = [
    path("meshnet-tracker-key", api.TrackerKeyApi.as_view(), name="tracker-key"),
]
