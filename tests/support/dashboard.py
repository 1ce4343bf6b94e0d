"""Rows for dashboard tests: staff users, nodes, and requests recorded by the real services."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.utils import timezone

from nodes_app.models import LanguageModel, Node, NodeStatus
from tracker_app.api_keys.services import api_key_create
from tracker_app.billing.pricing import HopWork
from tracker_app.completions import recording as accounting
from tracker_app.models import ApiKey, ChatRequest, RequestStatus

TINY = "tiny-random-llama"  # in the catalogue migration: 4 layers
PASSWORD = "dashboard-test-password"


def staff_user(username: str = "staff", *, is_staff: bool = True) -> User:
    return get_user_model().objects.create_user(
        username=username, password=PASSWORD, is_staff=is_staff
    )


def tiny_model() -> LanguageModel:
    # The catalogue migration adds it; transactional tests flush it, so add it back.
    model, _ = LanguageModel.objects.get_or_create(
        key=TINY,
        defaults={
            "display_name": "Tiny random Llama",
            "num_layers": 4,
            "weight_source": "builtin:tiny-random-llama",
            "prompt_price_per_1k": Decimal("0.01"),
            "completion_price_per_1k": Decimal("0.02"),
        },
    )
    return model


def make_node(
    node_id: str,
    start: int,
    end: int,
    *,
    model: LanguageModel | None = None,
    status: str = NodeStatus.ONLINE,
    seconds_silent: float = 1.0,
    wallet: str = "ab" * 32,
) -> Node:
    now = timezone.now()
    return Node.objects.create(
        id=node_id,
        wallet=wallet,
        endpoint=f"http://{node_id}.test:7000",
        model=model or tiny_model(),
        shard_start=start,
        shard_end=end,
        hardware="cpu",
        device_name="test cpu",
        benchmark_tps=120.0,
        status=status,
        token_hash="0" * 64,
        registered_at=now - timedelta(seconds=seconds_silent),
        last_heartbeat_at=now - timedelta(seconds=seconds_silent),
    )


def api_key(name: str = "client") -> ApiKey:
    return api_key_create(name=name).api_key


def completed_request(
    *,
    key: ApiKey,
    hops: list[Node],
    prompt_tokens: int = 1000,
    completion_tokens: int = 500,
    cached_tokens: int = 0,
    route: str = "",
    mode: str = "exploit",
    left: bool = False,
) -> ChatRequest:
    """A request opened, routed and completed through the accounting services (so billed);
    with ``left``, cancelled by a client that left mid-stream, billed for what it was sent."""
    model = hops[0].model
    request_id = uuid.uuid4()
    accounting.chat_request_open(
        request_id=request_id, api_key=key, model=model, stream=True, now=timezone.now()
    )
    accounting.chat_request_route(request_id=request_id, signature=route, mode=mode)
    accounting.chat_request_complete(
        request_id=request_id,
        model=model,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached_tokens,
        finish_reason="length",
        time_to_first_token_ms=20.0,
        tokens_per_second=42.5,
        work=[
            HopWork(
                node.pk,
                node.shard_start,
                node.shard_end,
                prompt_tokens - cached_tokens + completion_tokens,
            )
            for node in hops
        ],
        fee_share=Decimal("0.05"),
        now=timezone.now(),
        ended=RequestStatus.CANCELLED if left else RequestStatus.COMPLETED,
        error="client disconnected" if left else "",
    )
    return ChatRequest.objects.get(pk=request_id)


def failed_request(*, key: ApiKey, model: LanguageModel, cancelled: bool = False) -> ChatRequest:
    request_id = uuid.uuid4()
    accounting.chat_request_open(
        request_id=request_id, api_key=key, model=model, stream=False, now=timezone.now()
    )
    accounting.chat_request_fail(
        request_id=request_id, error="hop x failed", now=timezone.now(), cancelled=cancelled
    )
    return ChatRequest.objects.get(pk=request_id)
