"""Routing endpoints under /v1/."""

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
