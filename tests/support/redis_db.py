"""A Redis database of a test's own on the shared server (CI's Redis is shared)."""

from __future__ import annotations

import random

import redis


def private_redis(url: str) -> str:
    """``url``'s server with one of databases 1-15, emptied first: no other test's queue."""
    base = url.rsplit("/", 1)[0] if url.count("/") > 2 else url
    private = f"{base}/{random.randint(1, 15)}"
    redis.Redis.from_url(private).flushdb()
    return private
