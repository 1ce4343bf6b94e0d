"""Routing: which chain of nodes serves a request, and what the tracker learns from it.

Routing reads ``nodes_app`` (nodes, catalogue, topology epochs) and is read by
``tracker_app``; it never imports either the other way round (``lint-imports``).

A request meets the stages in this order (ADR-0026):

1. ``selectors`` and ``services`` are the app's reads and writes, the only
   calls ``tracker_app`` makes: ``services.route_choose`` before a stream,
   the ``route_session_*`` calls while it runs, ``route_sample_record`` when
   it completes; ``selectors.route_candidates``, ``routing_table`` and
   ``model_placement`` for what the tracker shows.
2. ``planning/`` — the candidates: the online nodes as plain records, the
   complete routes they form (``search``), cached per topology (``cache``),
   each a checked ``RoutePlan`` (``route_plan``); a client's pinned route
   (``pinned``); where a new node should serve (``placement``).
3. ``learning/`` — what each candidate is known to do: its arm (learned
   speed, ``arms``) in the process's ``RouteStatsStore`` (``stats``,
   ``tracker_store``), kept in step with the database (``durable``, pruned
   by ``pruning``) and the other trackers (``redis_merge``) by ``sync``.
4. ``exclusions/`` — what is kept out before a policy sees the candidates:
   nodes banned after failures (``bans``), routes quarantined by the probe
   (``probe_verdicts`` → ``quarantines``), held in the store (``kept_out``).
5. ``policies/`` — the choice: the configured policy (``config``,
   ``base``; ``thompson`` by default, ``adr0021``) picks one among the
   candidates' views, with priors for the unmeasured (``priors``) and the
   sessions in flight (``load``), and hands out a ``RouteDecision``
   (``choice``).

``api`` serves ``/v1/routing`` and the placement endpoints; ``tasks`` is the
prune job; ``models`` the durable arms, probes and quarantines.
"""
