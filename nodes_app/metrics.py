"""Prometheus series of the node registry: what each serving node reported in its
last heartbeat, read from the registry at scrape time.

Read at scrape time rather than set as gauges when a heartbeat arrives: a
deployment's trackers share the database, not their metric files, so each
would otherwise show only the heartbeats it happened to take, and a node that
left would keep its last figures. Only online and draining nodes have series:
an offline node's series end.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.db import DatabaseError
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from meshnet_site.errors import is_database_outage
from nodes_app.models import Node
from nodes_app.registration_checks import SERVING

logger = logging.getLogger(__name__)


class NodePrefixCaches(Collector):
    """Per serving node: ``meshnet_node_prefix_cache_load`` (the share of its KV budget
    its prefix cache holds, rounded up to a quarter) and ``meshnet_node_prefix_hits_total``
    (its prefix-cache hits since it started: a counter that restarts with the node).

    During a database outage it yields nothing, so the rest of ``/metrics`` still
    answers.
    """

    def collect(self) -> Iterator[Metric]:
        labels = ["node", "model"]
        load = GaugeMetricFamily(
            "meshnet_node_prefix_cache_load",
            "Share of the node's KV budget its prefix cache holds, rounded up to a quarter",
            labels=labels,
        )
        hits = CounterMetricFamily(
            "meshnet_node_prefix_hits",
            "Prefix-cache hits the node reported since it started",
            labels=labels,
        )
        try:
            rows = list(
                Node.objects.filter(status__in=SERVING)
                .order_by("id")
                .values_list("id", "model__key", "prefix_cache_load", "prefix_hits")
            )
        except DatabaseError as error:
            if not is_database_outage(error):
                raise
            logger.warning("metrics: the database did not answer; node series left out")
            return
        for node_id, model_key, cache_load, hit_count in rows:
            load.add_metric([node_id, model_key], cache_load)
            hits.add_metric([node_id, model_key], hit_count)
        yield load
        yield hits


NODE_FIGURES = CollectorRegistry()
NODE_FIGURES.register(NodePrefixCaches())
