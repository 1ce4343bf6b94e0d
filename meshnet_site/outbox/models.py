"""One message waiting for a tracker to forward it to the dashboards."""

from __future__ import annotations

from django.db import models


class OutboxMessage(models.Model):
    """A dashboard event a background job wrote; a tracker deletes it when it forwards it.

    ``kind`` names the event (``node offline``, ``route quarantined``…),
    ``subject`` what it is about (a node id, a route signature), ``payload``
    its JSON-ready details.
    """

    kind = models.CharField(max_length=64)
    subject = models.CharField(max_length=2000, blank=True)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.subject}"
