"""Databases for tracker and worker processes under test, and reading what they wrote."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tracker_app.localnet import fresh_sqlite_database, migrate


@contextlib.contextmanager
def fresh_process_database() -> Iterator[str]:
    """A new, migrated database for real tracker/worker processes; yields its URL.

    PostgreSQL when DATABASE_URL points at one (CI): a new database on that
    server, dropped afterwards. Otherwise a SQLite file of its own.
    """
    configured = os.environ.get("DATABASE_URL", "")
    if not configured.startswith(("postgres://", "postgresql://")):
        yield fresh_sqlite_database(Path(tempfile.mkdtemp(prefix="meshnet-proc-")))
        return
    import psycopg

    name = f"meshnet_proc_{uuid.uuid4().hex[:10]}"
    server = configured.rsplit("/", 1)[0]
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = f"{server}/{name}"
        migrate(url)
        yield url
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def query_process_database(database_url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run ``sql`` on the processes' database (``%s`` placeholders, either database).

    Returns the rows of a query, ``[]`` for a statement (writes are committed).
    """
    if database_url.startswith("sqlite:///"):
        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
            return list(conn.execute(sql.replace("%s", "?"), params))
    import psycopg

    with psycopg.connect(database_url) as conn:
        cursor = conn.execute(sql, params)
        return list(cursor) if cursor.description is not None else []
