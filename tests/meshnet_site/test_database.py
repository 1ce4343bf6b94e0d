"""``through_outage``: which database errors are waited out, and for how long."""

from __future__ import annotations

import asyncio

from django.db import IntegrityError, OperationalError

from meshnet_site.database import through_outage
from tests.support.database_errors import connection_cut


def _run(failures: list[Exception], pauses: tuple[float, ...]) -> tuple[object, list[float], int]:
    """What ``through_outage`` returns (or raises) for a call failing with ``failures``
    in turn, the pauses it took and how many times it called."""
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

    try:
        outcome: object = asyncio.run(through_outage(call, pauses=pauses, sleep=sleep))
    except Exception as error:
        outcome = error
    return outcome, waited, calls


def test_an_outage_is_waited_out_pause_by_pause_until_the_write_lands() -> None:
    assert _run([connection_cut(), connection_cut()], (0.5, 1.0, 2.5)) == ("written", [0.5, 1.0], 3)


def test_an_outage_past_the_last_pause_is_raised_after_one_try_per_pause_and_a_last() -> None:
    outcome, waited, calls = _run(
        [connection_cut(), connection_cut(), connection_cut()], (0.5, 1.0)
    )

    assert isinstance(outcome, OperationalError)
    assert (waited, calls) == ([0.5, 1.0], 3)


def test_an_error_that_is_not_an_outage_is_raised_at_once() -> None:
    outcome, waited, calls = _run([IntegrityError("duplicate key"), connection_cut()], (0.5, 1.0))

    assert isinstance(outcome, IntegrityError)
    assert (waited, calls) == ([], 1)
