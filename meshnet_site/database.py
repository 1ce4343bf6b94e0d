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
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from channels.db import database_sync_to_async

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["database_call"]


def database_call(func: Callable[P, R]) -> Callable[P, Coroutine[Any, Any, R]]:
    """``func`` (ORM work, one transaction at most) as an awaitable that runs beside others."""
    return database_sync_to_async(func, thread_sensitive=False)
