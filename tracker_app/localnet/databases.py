"""Databases for throwaway networks' tracker and worker processes, and reading what they wrote.

Tests and benchmarks give each network a fresh one (:func:`fresh_process_database`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sqlite3
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tracker_app.localnet.network import fresh_sqlite_database, migrate


@contextlib.contextmanager
def fresh_process_database() -> Iterator[str]:
    """A new, migrated database for real tracker/worker processes; yields its URL.

    PostgreSQL when DATABASE_URL points at one (CI): a new database on that
    server, copied from this run's migrated template (see
    :func:`_migrated_template`), dropped afterwards. Otherwise a SQLite file
    of its own.
    """
    configured = os.environ.get("DATABASE_URL", "")
    if not configured.startswith(("postgres://", "postgresql://")):
        yield fresh_sqlite_database(Path(tempfile.mkdtemp(prefix="meshnet-proc-")))
        return
    server = configured.rsplit("/", 1)[0]
    name = f"meshnet_proc_{uuid.uuid4().hex[:10]}"
    _server_command(server, f'CREATE DATABASE "{name}" TEMPLATE "{_migrated_template(server)}"')
    try:
        yield f"{server}/{name}"
    finally:
        _drop(server, name)


# server → the template this test run migrated there, made on first use.
_templates: dict[str, str] = {}


def _migrated_template(server: str) -> str:
    """A database on ``server`` migrated once per run, for PostgreSQL to copy.

    Copying a template takes a tenth of a second where running the
    migrations takes seconds, and nearly every process test needs a fresh
    database. Nobody connects to the template after its migration (a
    connection would make PostgreSQL refuse to copy it); it is dropped
    when the run's interpreter exits.
    """
    if server not in _templates:
        name = f"meshnet_template_{uuid.uuid4().hex[:10]}"
        _server_command(server, f'CREATE DATABASE "{name}"')
        try:
            migrate(f"{server}/{name}")
        except BaseException:
            _drop(server, name)
            raise
        if not _templates:
            atexit.register(_drop_templates)
        _templates[server] = name
    return _templates[server]


def _drop_templates() -> None:
    while _templates:
        _drop(*_templates.popitem())


def _drop(server: str, name: str) -> None:
    _server_command(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _server_command(server: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(sql)


def query_process_database(database_url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run ``sql`` on the processes' database (``%s`` placeholders, either database).

    Returns the rows of a query, ``[]`` for a statement (writes are committed).
    """
    if database_url.startswith("sqlite:///"):
        # Django keeps a UUIDField in SQLite as its 32 hex digits.
        values = tuple(value.hex if isinstance(value, uuid.UUID) else value for value in params)
        with sqlite3.connect(database_url.removeprefix("sqlite:///")) as conn:
            return list(conn.execute(sql.replace("%s", "?"), values))
    import psycopg

    with psycopg.connect(database_url) as conn:
        cursor = conn.execute(sql, params)
        return list(cursor) if cursor.description is not None else []
