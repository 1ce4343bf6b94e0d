"""A burst of plain requests shares the tracker's pooled PostgreSQL connections.

Under ASGI each concurrent request to a plain Django view runs on a thread
of its own; with persistent per-thread connections 200 concurrent
``/healthz`` opened one connection each and PostgreSQL refused 106 of them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.support.network import running_tracker
from tracker_app.localnet import fresh_process_database

POOL = 4
REQUESTS = 200


async def _burst(url: str) -> list[int]:
    limits = httpx.Limits(max_connections=REQUESTS)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        answers = await asyncio.gather(*(client.get(f"{url}/healthz") for _ in range(REQUESTS)))
    return [answer.status_code for answer in answers]


def test_a_burst_of_requests_is_served_on_the_pool_without_one_connection_each(
    tmp_path: Path,
) -> None:
    # A database of its own: the run's shared tracker holds connections to the shared one.
    with fresh_process_database() as database_url:
        if not database_url.startswith(("postgres://", "postgresql://")):
            pytest.fail("the pool is PostgreSQL's: set DATABASE_URL to a PostgreSQL database")
        with running_tracker(
            database_url, tmp_path, MESHNET_DATABASE_POOL_SIZE=str(POOL)
        ) as tracker:
            statuses = asyncio.run(_burst(tracker.url))
            held = tracker.query(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            )[0][0]

    assert statuses == [200] * REQUESTS
    assert held - 1 <= POOL  # less this query's own connection
