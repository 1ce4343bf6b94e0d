"""The durable guards with real processes: threads in several processes racing over one
database, and the worker pruning what expired.

PostgreSQL when DATABASE_URL points at one (CI), else a SQLite file.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.guards import race_in_processes
from tests.support.network import start_worker
from tracker_app.localnet import (
    fresh_process_database,
    process_env,
    query_process_database,
    wait_until,
)

PROCESSES = 3
THREADS = 4


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    with fresh_process_database() as url:
        yield url


def test_of_concurrent_claims_of_one_value_exactly_one_wins(
    database_url: str, tmp_path: Path
) -> None:
    results = race_in_processes(
        database_url, tmp_path, "claim", "one-signature",
        processes=PROCESSES, threads=THREADS, times=1, now=time.time(),
    )  # fmt: skip

    assert len(results) == PROCESSES * THREADS
    assert results.count(True) == 1


def test_concurrent_hits_of_one_counter_each_get_their_own_count(
    database_url: str, tmp_path: Path
) -> None:
    times = 10
    results = race_in_processes(
        database_url, tmp_path, "hit", "api-key:racing",
        processes=PROCESSES, threads=THREADS, times=times, now=time.time(),
    )  # fmt: skip

    assert sorted(results) == list(range(1, PROCESSES * THREADS * times + 1))


def test_the_worker_prunes_expired_claims_and_counters_and_keeps_live_ones(
    database_url: str, tmp_path: Path
) -> None:
    def query(sql: str, *params: object) -> list[tuple[object, ...]]:
        return query_process_database(database_url, sql, *params)

    for scope, expires_at in (("expired", "2020-01-01 00:00:00"), ("live", "2999-01-01 00:00:00")):
        query(
            "INSERT INTO guards_onceclaim (scope, digest, expires_at) VALUES (%s, %s, %s)",
            scope, "d" * 64, expires_at,
        )  # fmt: skip
        query(
            "INSERT INTO guards_windowcounter (key, window_start, count, expires_at) "
            "VALUES (%s, 0, 1, %s)",
            scope, expires_at,
        )  # fmt: skip
    env = process_env(
        database_url,
        REDIS_URL=None,
        MESHNET_VAR_DIR=str(tmp_path / "var"),
        MESHNET_GUARDS_PRUNE_INTERVAL="1",
    )

    with start_worker(env, tmp_path) as worker:
        wait_until(
            lambda: not query("SELECT id FROM guards_windowcounter WHERE key = 'expired'"),
            timeout=60,
            what="the worker to prune the expired counter",
            process=worker,
        )

    assert query("SELECT scope FROM guards_onceclaim WHERE digest = %s", "d" * 64) == [("live",)]
    assert query("SELECT key FROM guards_windowcounter WHERE window_start = 0") == [("live",)]
