"""What the tracker learns about each route, and how it keeps and shares it (ADR-0003).

In the order a request meets them:

- ``stats`` — ``RouteStatsStore``: a candidate as the policy sees it
  (``ArmView``), its arm and what is kept out (``routing_app.exclusions``)
  composed.
- ``arms`` — ``RouteArms``: per (model, signature) the decayed EWMA of real
  tokens/s, its sample mass, epoch and status; a completed request's sample
  lands here (``services.route_sample_record``).
- ``tracker_store`` — the process's one store (``route_stats_store()``),
  built from the settings on first use, and the daemon thread that syncs it.
- ``sync`` — ``StatsSync``: the store's only I/O, every few seconds:
  ``durable`` (the database copy, restored at start) and ``redis_merge``
  (the other trackers' arms, bans and timed quarantines).
- ``pruning`` — the Celery prune job's work (``routing.prune_arms``): arms
  nobody sampled for the TTL, and old snapshots.
"""
