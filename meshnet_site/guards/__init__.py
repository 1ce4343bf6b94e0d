"""Durable guards: once-only claims and fixed-window counters, kept in the database.

The registration replay guard and the rate limits used to live in Django's
cache, which in the embedded deployment is a small local-memory cache:
enough other entries evict a guard, and a replayed registration or a
client past its limit gets through. Here every guard is a row, shared by
every tracker process over the one database (SQLite embedded, PostgreSQL in
production), and decided by a single statement against a unique constraint,
so concurrent callers cannot both win. The worker prunes expired rows
(``guards.prune``).
"""
