"""Route enumeration, route statistics and choice, over the registry's nodes and models.

Routing reads ``nodes_app`` (nodes, catalogue, topology epochs) and is read by
``tracker_app``; it never imports either the other way round (``lint-imports``).

One request's choice: ``services.route_choose`` reads the candidates
(``selectors``, ``planner``) and asks the configured policy
(``config.RoutingConfig.route_policy()``: ``policy.RoutePolicy``, implemented
by ``adr0021`` and ``thompson``) to ``choose`` among their views in the
``stats.RouteStatsStore``, counting the request in the load book (``load``).
The store composes the learned speeds (``arms``) and what is kept out
(``exclusions``: nodes banned after failures, ``bans``; routes quarantined by
the probe, ``probing`` and ``quarantines``); ``sync`` keeps it in step with
its durable copy (``durable``, pruned by ``pruning``) and its peers
(``redis_merge``), in the tracker's thread (``tracker_store``). ``table`` and
``api`` show it all at ``/v1/routing``.
"""
