"""What the completion proxy (:mod:`~tracker_app.completions.proxy`) takes and gives: a
client's request, the deployment's settings it runs under, and how the request ended."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.conf import settings

from meshnet_site.errors import DomainError
from nodes_app.models import LanguageModel
from tracker_app.completions.answers import AnswerKind
from tracker_app.completions.parameters import GenerationParams
from tracker_app.models import ApiKey

# At most one progress event per request this often (leading and trailing edge).
PROGRESS_INTERVAL_SECONDS = 0.5

Send = Callable[[bytes], Awaitable[None]]


@dataclass(frozen=True)
class CompletionRequest:
    """What a client asked for: the parsed body, its key, the model, the endpoint's
    answer shape."""

    params: GenerationParams
    api_key: ApiKey
    model: LanguageModel
    answer: AnswerKind


@dataclass(frozen=True)
class ProxySettings:
    """The deployment's deadlines and fee, and the clock, sleep and randomness the busy
    back-off runs on (tests freeze them)."""

    busy_deadline: float
    step_timeout: float
    fee_share: Decimal
    request_deadline: float = 1800.0
    key_lease_seconds: float = 60.0
    # How long a node's busy answers may stay unexplained before they are taken for lies.
    busy_claim_grace: float = 10.0
    progress_interval: float = PROGRESS_INTERVAL_SECONDS
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    rng: random.Random = field(default_factory=random.Random)

    @classmethod
    def from_settings(cls, **overrides: Any) -> ProxySettings:
        """MESHNET_BUSY_DEADLINE, MESHNET_HOP_STEP_TIMEOUT, MESHNET_NETWORK_FEE_SHARE,
        MESHNET_REQUEST_DEADLINE, MESHNET_KEY_LEASE_SECONDS and two heartbeat intervals
        (MESHNET_NODE_HEARTBEAT_INTERVAL), unless ``overrides`` says otherwise."""
        configured: dict[str, Any] = {
            "busy_deadline": settings.MESHNET_BUSY_DEADLINE,
            "step_timeout": settings.MESHNET_HOP_STEP_TIMEOUT,
            "fee_share": settings.MESHNET_NETWORK_FEE_SHARE,
            "request_deadline": settings.MESHNET_REQUEST_DEADLINE,
            "key_lease_seconds": settings.MESHNET_KEY_LEASE_SECONDS,
            "busy_claim_grace": 2 * settings.MESHNET_NODE_HEARTBEAT_INTERVAL,
        }
        return cls(**(configured | overrides))


@dataclass(frozen=True)
class CompletionResult:
    """How a request ended: its whole answer (``stream: false``; None when streamed, its
    events were the answer), or the error it ended with (recorded failed, not charged)."""

    reply: Mapping[str, object] | None = None
    error: DomainError | None = None
