"""The tracker process's one ``RouteStatsStore``, kept in step by a daemon thread.

``route_stats_store()`` builds the store on first use from the settings as
they are then (so ``runtracker`` flag overrides apply). It is wired to the
database archive under this tracker's id (``tracker_id()``) and restores
what that tracker had learned before it restarted; with ``REDIS_URL`` set it
is also wired to a ``RedisArmExchange`` (both through a ``StatsSync``). A
daemon thread syncs every ``SYNC_INTERVAL_SECONDS``: writes the arms that
took samples, drops the arms the prune job deleted, takes in the probe's
quarantines and, with Redis, publishes and merges with the other trackers.
"""

from __future__ import annotations

import logging
import socket
import threading

import redis
from django.conf import settings
from django.db import close_old_connections

from routing_app.learning.durable import DatabaseArmArchive
from routing_app.learning.prefix_memory import prefix_memory
from routing_app.learning.redis_merge import RedisArmExchange
from routing_app.learning.stats import RouteStatsStore
from routing_app.learning.sync import StatsSync
from routing_app.policies.config import RoutePolicyConfig

logger = logging.getLogger(__name__)

SYNC_INTERVAL_SECONDS = 5.0
# A peer that has not published for this long drops out of the picture.
PEER_TTL_SECONDS = 60.0

_lock = threading.Lock()
_store: RouteStatsStore | None = None
_thread: StatsSyncThread | None = None


class StatsSyncThread(threading.Thread):
    """Calls ``sync.sync()`` every ``interval`` seconds until stopped.

    A failing sync (database or Redis away) is logged and retried on the next
    tick: the local store keeps routing on what this tracker measured itself.
    """

    def __init__(self, sync: StatsSync, interval: float) -> None:
        super().__init__(name="route-stats-sync", daemon=True)
        self.sync = sync
        self.interval = interval
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(self.interval):
            try:
                # Each sync is a unit of work, like a request: a connection the
                # database dropped or that outlived its age is replaced first.
                close_old_connections()
                self.sync.sync()
                close_old_connections()
            except Exception:  # keep routing on local statistics; retry next tick
                logger.warning("route statistics sync failed", exc_info=True)

    def stop(self) -> None:
        self._stopped.set()


def tracker_id() -> str:
    """This tracker's name for its durable statistics and its Redis publication.

    ``MESHNET_TRACKER_ID`` when set; ``runtracker`` sets it to ``host:port``
    otherwise, which a restarted tracker keeps. Any other process (tests, a
    shell) falls back to the host name.
    """
    return str(getattr(settings, "MESHNET_TRACKER_ID", "") or socket.gethostname())


def route_stats_store() -> RouteStatsStore:
    """The store every part of this tracker process records to and chooses from."""
    global _store, _thread
    with _lock:
        if _store is None:
            sync = stats_sync_from_settings()
            _store = sync.store
            _thread = StatsSyncThread(sync, SYNC_INTERVAL_SECONDS)
            _thread.start()
        return _store


def stats_sync_from_settings() -> StatsSync:
    """A store and what keeps it in step, built from the settings as they are now.

    The database archive under ``tracker_id()``, restored from at once (a
    database that is not there yet is logged, and learning starts from
    scratch); a ``RedisArmExchange`` too when ``REDIS_URL`` is set. Starts
    no thread: ``route_stats_store()`` builds the process's store with it.
    """
    config = RoutePolicyConfig.from_settings()
    name = tracker_id()
    archive = DatabaseArmArchive(tracker_id=name)
    exchange = None
    url = getattr(settings, "REDIS_URL", None)
    if url:
        client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        # Publishing under the tracker's stable id, a restarted tracker replaces
        # its old publication instead of meeting its own past as a peer.
        exchange = RedisArmExchange(client=client, ttl=PEER_TTL_SECONDS, process_id=name)
    sync = StatsSync(
        RouteStatsStore.from_config(config),
        archive=archive,
        exchange=exchange,
        prefixes=prefix_memory(),
    )
    try:
        restored = sync.restore()
    except Exception:  # no database yet: learn from scratch, the sync retries writing
        logger.warning("could not restore the durable route statistics", exc_info=True)
    else:
        if restored:
            logger.info("restored %d learned route arms of tracker %s", restored, name)
    return sync
