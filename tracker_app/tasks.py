"""Background jobs of the tracker."""

from datetime import timedelta

from celery import shared_task
from django.utils import timezone

from tracker_app.accounting import chat_requests_fail_abandoned

# Longer than any generation runs (4,096 tokens at under 1 token/s).
ABANDONED_AFTER = timedelta(hours=3)


@shared_task(name="requests.fail_abandoned")
def fail_abandoned_requests() -> int:
    """Close requests a stopped tracker left processing; returns how many."""
    return chat_requests_fail_abandoned(now=timezone.now(), older_than=ABANDONED_AFTER)
