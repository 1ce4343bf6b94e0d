"""Keeping a tracker's route statistics in step: the durable copy and the peers.

``StatsSync.sync()`` is the only call that does I/O for a ``RouteStatsStore``:
it writes the arms that took samples to the archive (``routing_app.learning.durable``)
and takes in its news (the arms the prune job deleted, the routes the probe
quarantines), then, with Redis (``routing_app.learning.redis_merge``), publishes this
tracker's own arms, bans, timed quarantines and recently served prefixes
(``routing_app.learning.prefix_memory``) and takes in its peers'.
``routing_app.learning.tracker_store`` runs it periodically in a daemon thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from routing_app.learning.arms import ArmKey, ArmState, PrunedState
from routing_app.learning.prefix_memory import PrefixMemory
from routing_app.learning.stats import RouteStatsStore


class ArmExchange(Protocol):
    """Publishes this store's own state and returns every other store's (see redis_merge)."""

    def exchange(self, payload: dict[str, Any]) -> list[dict[str, Any]]: ...


@dataclass(frozen=True, slots=True)
class ArchiveNews:
    """What the durable copy tells a tracker at a sync: prunes and probe quarantines."""

    pruned: Sequence[PrunedState] = ()
    quarantined: frozenset[ArmKey] = frozenset()


class ArmArchive(Protocol):
    """This store's durable copy (see ``routing_app.learning.durable``)."""

    def restore(self) -> list[tuple[ArmKey, ArmState]]:
        """The arms this tracker had written before it (re)started."""
        ...

    def exchange(self, changed: Sequence[tuple[ArmKey, ArmState]]) -> ArchiveNews:
        """Write ``changed`` (this tracker's arms that took samples since the last
        call); return what was pruned since the last call and what is quarantined."""
        ...


class StatsSync:
    """Syncs ``store`` with its ``archive`` (the database) and ``exchange`` (Redis), each
    optional: with neither, the store is ADR-0021's single tracker. Through the
    exchange the process's ``prefixes`` (where requests' prefixes are warm, ADR-0029)
    are shared too."""

    def __init__(
        self,
        store: RouteStatsStore,
        *,
        archive: ArmArchive | None = None,
        exchange: ArmExchange | None = None,
        prefixes: PrefixMemory | None = None,
    ) -> None:
        self.store = store
        self.archive = archive
        self.exchange = exchange
        self.prefixes = prefixes

    def restore(self) -> int:
        """Take back the arms this tracker wrote to its archive before it restarted.

        Arms it already holds are kept as they are. Returns how many were
        restored; without an archive, 0.
        """
        if self.archive is None:
            return 0
        return self.store.arms.restore(self.archive.restore())

    def sync(self) -> None:
        """Write this tracker's changed arms to the archive and take in its news (prunes,
        probe quarantines), then publish to and merge with the peers (with Redis).

        Blocking (database and network I/O): call it from a thread, e.g.
        ``await sync.sync_async()``. A failing archive does not stop the Redis
        merge; the first error is raised after both were tried.
        """
        arms, exclusions = self.store.arms, self.store.exclusions
        exclusions.drop_lapsed()
        arms.drop_old_tombstones()
        failure: Exception | None = None
        if self.archive is not None:
            try:
                self._archive_sync(self.archive)
            except Exception as error:
                failure = error
        if self.exchange is not None:
            payloads = self.exchange.exchange(self.export())
            arms.absorb(payload.get("arms", []) for payload in payloads)
            exclusions.absorb(payloads)
            if self.prefixes is not None:
                self.prefixes.absorb(
                    batch for payload in payloads for batch in payload.get("prefixes", [])
                )
        if failure is not None:
            raise failure

    async def sync_async(self) -> None:
        """``sync()`` in a worker thread, for a caller on an asyncio loop."""
        await asyncio.to_thread(self.sync)

    def export(self) -> dict[str, Any]:
        """This tracker's own state (never what it merged in), as its peers read it."""
        own: dict[str, Any] = {"arms": self.store.arms.export(), **self.store.exclusions.export()}
        if self.prefixes is not None:
            own["prefixes"] = self.prefixes.export()
        return own

    def _archive_sync(self, archive: ArmArchive) -> None:
        arms = self.store.arms
        changed = arms.take_unwritten()
        try:
            news = archive.exchange(changed)
        except Exception:
            arms.mark_unwritten(key for key, _ in changed)
            raise
        arms.forget_pruned(news.pruned)
        self.store.exclusions.set_probe_quarantines(news.quarantined)
