"""Signals the node registry sends, for the apps above it to react to.

``topology_changed`` is sent once per topology epoch bump, after the
transaction that bumped it commits, with ``model_key`` and ``epoch``
(routing queues a route probe on it). The registry cannot import the apps
that react, so they connect here.
"""

from django.dispatch import Signal

topology_changed = Signal()
