"""Talking to the tracker: its plan-signing key, signed registration, heartbeats, deregistration.

The node token is a secret: it is kept in memory and never logged.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nodes_app.protocol.errors import ProtocolError
from nodes_app.protocol.limits import TRACKER_KEY_ALGORITHM, TRACKER_KEY_PATH
from nodes_app.protocol.registration import (
    DEFAULT_PRECISION,
    MAX_REPORTED_PREFIX_HITS,
    MAX_REPORTED_TPS,
    DraftNamed,
)
from nodes_app.shared.signing import public_key_from_hex, sign_registration, wallet_of


class RegistrationError(Exception):
    """The tracker refused the node (its message says why) or could not be reached."""


@dataclass(frozen=True)
class NodeAnnouncement:
    endpoint: str
    model: str
    shard_start: int
    shard_end: int
    num_layers: int
    hardware: str
    device_name: str
    benchmark_tps: float
    # The shard's compute dtype and weight quantisation
    # (nodes_app.protocol.registration.PRECISIONS).
    precision: str = DEFAULT_PRECISION


@dataclass(frozen=True)
class TrackerRegistration:
    node_id: str
    token: str
    heartbeat_interval: float
    # The model's draft model, which a head runs (ADR-0028); None: the model has none.
    draft: DraftNamed | None = None


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        return f"{error.get('message', response.text[:300])} ({error.get('code', '?')})"
    except ValueError:
        return response.text[:300]


class TrackerClient:
    def __init__(self, tracker_url: str, key: Ed25519PrivateKey, client: httpx.AsyncClient):
        self.url = tracker_url.rstrip("/")
        self.base = self.url + "/api/nodes"
        self.key = key
        self.client = client

    async def signing_key(self, *, retry_for: float = 30.0) -> str:
        """The key (hex) the tracker publishes for signing plans, waiting for it to answer.

        Raises RegistrationError when it does not answer, or answers with no ed25519 key.
        """
        deadline = time.monotonic() + retry_for
        while True:
            try:
                response = await self.client.get(self.url + TRACKER_KEY_PATH)
                break
            except httpx.TransportError as error:
                if time.monotonic() > deadline:
                    raise RegistrationError(f"tracker unreachable: {error}") from error
                await asyncio.sleep(1.0)
        try:
            published = response.json()
            if response.status_code != 200 or published["algorithm"] != TRACKER_KEY_ALGORITHM:
                raise ValueError("not an ed25519 key")
            key = str(published["public_key"])
            public_key_from_hex(key)
        except (ValueError, KeyError, TypeError):
            raise RegistrationError(
                f"the tracker publishes no ed25519 key at {TRACKER_KEY_PATH} "
                f"(HTTP {response.status_code})"
            ) from None
        return key

    async def register(
        self, node: NodeAnnouncement, *, retry_for: float = 30.0
    ) -> TrackerRegistration:
        fields: dict[str, Any] = {
            "wallet": wallet_of(self.key),
            "endpoint": node.endpoint,
            "model": node.model,
            "shard_start": node.shard_start,
            "shard_end": node.shard_end,
            "num_layers": node.num_layers,
            "hardware": node.hardware,
            "device_name": node.device_name,
            "precision": node.precision,
            "benchmark_tps": round(_reportable_tps(node.benchmark_tps), 3),
            "timestamp": time.time(),
        }
        deadline = time.monotonic() + retry_for
        while True:
            try:
                body = {**fields, "signature": sign_registration(self.key, fields)}
                response = await self.client.post(f"{self.base}/register", json=body)
                break
            except httpx.TransportError as error:
                if time.monotonic() > deadline:
                    raise RegistrationError(f"tracker unreachable: {error}") from error
                await asyncio.sleep(1.0)
                fields["timestamp"] = time.time()
        if response.status_code != 201:
            raise RegistrationError(
                f"tracker refused registration (HTTP {response.status_code}): "
                f"{_error_message(response)}"
            )
        data = response.json()
        try:
            draft = DraftNamed.from_answer(data.get("draft"))
        except ProtocolError as error:
            raise RegistrationError(str(error)) from None
        return TrackerRegistration(
            node_id=str(data["node_id"]),
            token=str(data["node_token"]),
            heartbeat_interval=float(data.get("heartbeat_interval", 10.0)),
            draft=draft,
        )

    def _auth(self, registration: TrackerRegistration) -> dict[str, str]:
        return {"Authorization": f"Bearer {registration.token}"}

    async def heartbeat(
        self,
        registration: TrackerRegistration,
        *,
        active_sessions: int,
        queue_depth: int,
        tps: float,
        prefix_cache_load: float,
        prefix_hits: int,
    ) -> int:
        """The tracker's status code (401/404 means it forgot this node: register again).

        ``prefix_cache_load`` and ``prefix_hits``: the prefix cache as the node's
        open health page shows it (``server.public_health``).
        """
        response = await self.client.post(
            f"{self.base}/{registration.node_id}/heartbeat",
            json={
                "active_sessions": active_sessions,
                "queue_depth": queue_depth,
                "measured_tps": round(_reportable_tps(tps), 3),
                "prefix_cache_load": prefix_cache_load,
                "prefix_hits": min(prefix_hits, MAX_REPORTED_PREFIX_HITS),
            },
            headers=self._auth(registration),
        )
        return response.status_code

    async def deregister(self, registration: TrackerRegistration) -> None:
        response = await self.client.post(
            f"{self.base}/{registration.node_id}/deregister", headers=self._auth(registration)
        )
        if response.status_code not in (204, 404):
            raise RegistrationError(f"deregistration failed: HTTP {response.status_code}")


def _reportable_tps(tps: float) -> float:
    """Tokens/s within the range the tracker accepts (it refuses anything else)."""
    if not math.isfinite(tps):
        return 0.0
    return min(max(0.0, float(tps)), MAX_REPORTED_TPS)
