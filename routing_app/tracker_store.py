"""The tracker process's one ``RouteStatsStore``, kept in sync by a daemon thread.

``route_stats_store()`` builds the store on first use from the settings as
they are then (so ``runtracker`` flag overrides apply). With ``REDIS_URL``
set it is wired to a ``RedisArmExchange`` and a daemon thread publishes and
merges every ``SYNC_INTERVAL_SECONDS``; without Redis the same thread only
prunes, and the store behaves exactly as ADR-0021's single tracker.
"""

from __future__ import annotations

import logging
import threading

import redis
from django.conf import settings

from routing_app.config import RoutingConfig
from routing_app.redis_merge import RedisArmExchange
from routing_app.stats import RouteStatsStore

logger = logging.getLogger(__name__)

SYNC_INTERVAL_SECONDS = 5.0
# Without peers there is nothing to exchange, only arms to prune.
PRUNE_INTERVAL_SECONDS = 60.0
# A peer that has not published for this long drops out of the picture.
PEER_TTL_SECONDS = 60.0

_lock = threading.Lock()
_store: RouteStatsStore | None = None
_thread: StatsSyncThread | None = None


class StatsSyncThread(threading.Thread):
    """Calls ``store.sync()`` every ``interval`` seconds until stopped.

    A failing sync (Redis away) is logged and retried on the next tick: the
    local store keeps routing on what this tracker measured itself.
    """

    def __init__(self, store: RouteStatsStore, interval: float) -> None:
        super().__init__(name="route-stats-sync", daemon=True)
        self.store = store
        self.interval = interval
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(self.interval):
            try:
                self.store.sync()
            except Exception:  # keep routing on local statistics; retry next tick
                logger.warning("route statistics sync failed", exc_info=True)

    def stop(self) -> None:
        self._stopped.set()


def route_stats_store() -> RouteStatsStore:
    """The store every part of this tracker process records to and chooses from."""
    global _store, _thread
    with _lock:
        if _store is None:
            _store, interval = _build()
            _thread = StatsSyncThread(_store, interval)
            _thread.start()
        return _store


def _build() -> tuple[RouteStatsStore, float]:
    config = RoutingConfig.from_settings()
    url = getattr(settings, "REDIS_URL", None)
    if not url:
        return RouteStatsStore.from_config(config), PRUNE_INTERVAL_SECONDS
    client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
    exchange = RedisArmExchange(client=client, ttl=PEER_TTL_SECONDS)
    return RouteStatsStore.from_config(config, exchange=exchange), SYNC_INTERVAL_SECONDS


def route_stats_store_install(store: RouteStatsStore | None) -> RouteStatsStore | None:
    """Replace the process's store (tests); returns the previous one, ``None`` resets.

    An installed store gets no sync thread: its owner calls ``sync()``.
    """
    global _store, _thread
    with _lock:
        previous = _store
        if _thread is not None:
            _thread.stop()
            _thread = None
        _store = store
        return previous
