"""The Meshnet Django project: settings, URLs, the ASGI app and the Celery app."""

from meshnet_site.celery import app as celery_app

__all__ = ["celery_app"]
