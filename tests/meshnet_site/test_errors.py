"""Which database errors are an outage (503 ``database_unavailable``) and which stay bugs."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest
from django.db import InterfaceError
from psycopg_pool import PoolTimeout

from meshnet_site.errors import is_database_outage
from tests.support.database_errors import django_error


@pytest.mark.parametrize(
    "cause",
    [
        psycopg.OperationalError("connection failed: Connection refused"),
        PoolTimeout("couldn't get a connection after 2.00 sec"),
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.ConnectionFailure("connection failure"),
    ],
)
def test_a_database_that_cannot_be_reached_is_an_outage(cause: BaseException) -> None:
    assert is_database_outage(django_error(cause))


def test_a_connection_already_closed_is_an_outage() -> None:
    assert is_database_outage(InterfaceError("connection already closed"))


@pytest.mark.parametrize(
    "cause",
    [
        psycopg.errors.DeadlockDetected("deadlock detected"),
        psycopg.errors.SerializationFailure("could not serialize access"),
        psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
        psycopg.errors.LockNotAvailable("could not obtain lock"),
        sqlite3.OperationalError("no such table: nodes_app_node"),
    ],
)
def test_a_query_the_database_refused_stays_a_bug(cause: BaseException) -> None:
    assert not is_database_outage(django_error(cause))
