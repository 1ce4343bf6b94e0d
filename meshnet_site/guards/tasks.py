"""Background job of the durable guards: pruning what expired."""

from celery import shared_task
from django.utils import timezone

from meshnet_site.guards.services import guards_prune


@shared_task(name="guards.prune")
def prune_guards() -> dict[str, int]:
    """Delete expired claims and counters; how many of each."""
    return guards_prune(now=timezone.now()).to_dict()
