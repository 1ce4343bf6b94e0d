"""Database calls from async code (the chat consumer and proxy).

Channels' ``database_sync_to_async`` is thread-sensitive by default: every
call in the process runs on one shared thread, one after another. Under load
that one thread is the queue: with 200 chats arriving together, each chat's
handful of short queries (key, model, rate limit, route, request record) waited
behind every other chat's, and the first tokens came seconds late while the
nodes sat idle. :func:`database_call` runs the function on a thread of the
event loop's default pool instead, closing stale connections around it as
channels does; PostgreSQL connections come from the process's pool
(``MESHNET_DATABASE_POOL_SIZE``) and SQLite waits for its write lock
(``meshnet_site.environment.database_config``).

:func:`through_outage` tries a write again while the database is unreachable,
for a write that must outlast a blip (a restart, a failover, a cut
connection) and is safe to repeat.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, ParamSpec, TypeVar

from channels.db import database_sync_to_async

from meshnet_site.errors import is_database_outage

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["OUTAGE_RETRY_PAUSES", "database_call", "through_outage"]

logger = logging.getLogger(__name__)

# Seconds to wait before each further try of a write that must outlast a database
# blip: 4 s of pauses, besides each try's own wait for a connection (the pool's
# 2 s): about a PostgreSQL restart.
OUTAGE_RETRY_PAUSES = (0.5, 1.0, 2.5)


def database_call(func: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """``func`` (ORM work, one transaction at most) as an awaitable that runs beside others."""
    return database_sync_to_async(func, thread_sensitive=False)


async def through_outage(
    call: Callable[[], Awaitable[R]],
    *,
    pauses: Sequence[float] = OUTAGE_RETRY_PAUSES,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> R:
    """``call()``, tried again after each of ``pauses`` while it fails because the
    database is unreachable (``is_database_outage``).

    Only for a call that is safe to repeat: a write that checks what it changes
    (a conditional update), so a try whose commit went through before the
    connection broke is not applied twice. Any other error, and the outage
    after the last pause, is raised.
    """
    for pause in pauses:
        try:
            return await call()
        except Exception as error:
            if not is_database_outage(error):
                raise
        logger.warning("the database is unavailable: trying again in %.1f s", pause)
        await sleep(pause)
    return await call()
