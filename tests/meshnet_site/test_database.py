"""``through_outage``: which database errors are waited out, and for how long."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from django.db import IntegrityError, OperationalError

from meshnet_site.database import through_outage


def _cut() -> OperationalError:
    error = OperationalError("server closed the connection unexpectedly")
    error.__cause__ = psycopg.OperationalError("server closed the connection unexpectedly")
    return error


def _run(failures: list[Exception], pauses: tuple[float, ...]) -> tuple[object, list[float], int]:
    """What ``through_outage`` returns for a call failing with ``failures`` in turn, the
    pauses it took and how many times it called."""
    waited: list[float] = []
    calls = 0

    async def call() -> str:
        nonlocal calls
        calls += 1
        if failures:
            raise failures.pop(0)
        return "written"

    async def sleep(seconds: float) -> None:
        waited.append(seconds)

    result = asyncio.run(through_outage(call, pauses=pauses, sleep=sleep))
    return result, waited, calls


def test_an_outage_is_waited_out_pause_by_pause_until_the_write_lands() -> None:
    assert _run([_cut(), _cut()], (0.5, 1.0, 2.5)) == ("written", [0.5, 1.0], 3)


def test_an_outage_past_the_last_pause_is_raised() -> None:
    with pytest.raises(OperationalError):
        _run([_cut(), _cut(), _cut()], (0.5, 1.0))


def test_an_error_that_is_not_an_outage_is_raised_at_once() -> None:
    with pytest.raises(IntegrityError):
        _run([IntegrityError("duplicate key"), _cut()], (0.5, 1.0))
