"""Durable route learning with real processes: restarts and the worker's prune (ADR-0003)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from celery import Celery

from tests.support.network import running_tracker, start_network
from tests.support.redis_db import private_redis
from tests.support.routing_processes import SETTINGS, TINY, chat, routes
from tracker_app.localnet import fresh_process_database, wait_until

# start_network yields its network once: as a context manager here.
network = contextmanager(start_network)


def test_a_restarted_tracker_routes_on_the_arms_it_had_learned(tmp_path: Path) -> None:
    with (
        fresh_process_database() as database_url,
        network(
            database_url, tmp_path, REDIS_URL=None, MESHNET_ROUTE_EXPLORE_SHARE="0", **SETTINGS
        ) as net,
    ):
        net.add_node("full", TINY, (0, 3))
        net.wait_for_route(TINY)
        assert chat(net.url, net.api_key)["meshnet"]["mode"] == "greedy-fallback"
        for _ in range(3):
            chat(net.url, net.api_key)
        [learned] = routes(net.url, net.api_key)
        assert learned["status"] == "proven"
        wait_until(
            lambda: (
                net.query("SELECT samples FROM routing_app_routearm") == [(learned["samples"],)]
            ),
            timeout=30,
            what="the tracker to write its arm",
        )

        assert net.tracker is not None
        port = int(net.url.rsplit(":", 1)[1])
        net.tracker.process.stop()
        net.start_tracker(port=port)

        [restored] = routes(net.url, net.api_key)
        assert (restored["status"], restored["samples"]) == ("proven", learned["samples"])
        assert restored["tps"] == pytest.approx(learned["tps"])
        assert chat(net.url, net.api_key)["meshnet"]["mode"] == "exploit"


def test_an_arm_the_worker_pruned_is_gone_from_the_routing_table_of_both_trackers(
    tmp_path: Path, redis_url: str
) -> None:
    redis = private_redis(redis_url)
    with (
        fresh_process_database() as database_url,
        network(database_url, tmp_path, REDIS_URL=redis, **SETTINGS) as net,
    ):
        net.add_node("full", TINY, (0, 3))
        net.wait_for_route(TINY)
        # A second tracker of the same deployment: it signs plans with the same key.
        with running_tracker(
            database_url,
            tmp_path / "second",
            REDIS_URL=redis,
            MESHNET_TRACKER_KEY_FILE=str(net.tracker_key_file),
            **SETTINGS,
        ) as second:
            trackers = [net.url, second.url]
            for url in trackers:
                chat(url, net.api_key)
            wait_until(
                lambda: len(net.query("SELECT tracker_id FROM routing_app_routearm")) == 2,
                timeout=30,
                what="both trackers to write their arm",
            )
            wait_until(  # each its own sample and its peer's, merged through Redis
                lambda: all(routes(url, net.api_key)[0]["samples"] == 2 for url in trackers),
                timeout=30,
                what="both trackers to merge their samples",
            )
            time.sleep(1.5)  # older than the worker's TTL below

            net.env["MESHNET_ROUTE_ARM_TTL"] = "1"
            worker = net.start_worker("--pool", "solo")
            Celery(broker=redis).send_task("routing.prune_arms")

            def pruned_everywhere() -> bool:
                return all(routes(url, net.api_key)[0]["status"] == "unsampled" for url in trackers)

            wait_until(
                pruned_everywhere, timeout=90, what="both trackers to drop the arm",
                process=worker,
            )  # fmt: skip
            assert net.query("SELECT COUNT(*) FROM routing_app_routearm") == [(0,)]
            assert net.query("SELECT COUNT(*) FROM routing_app_prunedarm") == [(2,)]
