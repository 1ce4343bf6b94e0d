"""Database errors as Django raises them, for tests of what the tracker makes of them."""

from __future__ import annotations

import psycopg
from django.db import OperationalError


def django_error(cause: BaseException) -> OperationalError:
    """Django's OperationalError wrapping the driver's ``cause``, as the ORM raises it."""
    error = OperationalError(str(cause))
    error.__cause__ = cause
    return error


def connection_cut() -> OperationalError:
    """What the ORM raises when the connection to PostgreSQL is cut (an outage)."""
    return django_error(psycopg.OperationalError("server closed the connection unexpectedly"))
