"""Several trackers, one picture: route statistics exchanged through Redis.

Each tracker process publishes only its *own* arms (what it measured itself)
under a key of its own with a TTL, and takes in every other process's
publication; the sync merges those with its own by decayed weight. Because
no process ever republishes what it merged in, no sample is counted twice,
and a tracker that stops publishing drops out of everyone's picture when its
key expires.

Layout under ``prefix``: ``{prefix}:proc:{process_id}`` holds a JSON export
(``StatsSync.export``); the sorted set ``{prefix}:procs`` lists the
process ids scored by their last publication time.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import redis

DEFAULT_PREFIX = "meshnet:routestats"


class RedisArmExchange:
    """Publish this process's route statistics and read its peers', one round trip each."""

    def __init__(
        self,
        *,
        client: redis.Redis,
        prefix: str = DEFAULT_PREFIX,
        process_id: str | None = None,
        ttl: float = 60.0,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.process_id = process_id or uuid.uuid4().hex
        self.ttl = ttl

    def _key(self, process_id: str) -> str:
        return f"{self.prefix}:proc:{process_id}"

    @property
    def _registry(self) -> str:
        return f"{self.prefix}:procs"

    def exchange(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        """Publish ``payload`` as this process's state; return the live peers' states."""
        now = time.time()
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self._key(self.process_id), json.dumps(payload), px=int(self.ttl * 1000))
        pipe.zadd(self._registry, {self.process_id: now})
        pipe.zremrangebyscore(self._registry, "-inf", now - self.ttl)
        pipe.expire(self._registry, int(self.ttl * 2) + 1)
        pipe.zrange(self._registry, 0, -1)
        members = pipe.execute()[-1]
        peers = [m.decode() if isinstance(m, bytes) else str(m) for m in members]
        peers = [peer for peer in peers if peer != self.process_id]
        if not peers:
            return []
        blobs = self.client.mget([self._key(peer) for peer in peers])
        return [json.loads(blob) for blob in blobs if blob is not None]
