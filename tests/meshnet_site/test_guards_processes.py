"""The durable guards under real concurrency: threads in several processes, one database.

PostgreSQL when DATABASE_URL points at one (CI), else a SQLite file.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.databases import fresh_process_database
from tests.support.guards import race_in_processes

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
