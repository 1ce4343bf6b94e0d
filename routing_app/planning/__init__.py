"""The candidates: the complete routes a model's online nodes form, as checked plans.

Plain values, no database: ``routing_app.selectors.routing_nodes`` turns the
registry's rows into ``NodeRecord`` values, so benchmarks and simulators use
these modules as they are. In the order a request meets them:

- ``cache`` — ``CandidateCache``: the routes of a topology are selected again
  only when it changes or after ``RESELECT_SECONDS``; in between, only their
  priors follow the nodes' scores (ADR-0018, "The cache").
- ``search`` — ``enumerate_routes``: a cover of every node on a complete
  route, then the best priors, at most ``MAX_CANDIDATES`` (ADR-0018);
  ``uncovered_layers`` says why there is none.
- ``route_plan`` — ``NodeRecord``, ``Hop`` and ``RoutePlan``: a plan that
  exists runs every layer once, in order, from its head (ADR-0003, ADR-0020);
  how plans are built from records, rescored and ranked.
- ``pinned`` — ``plan_pinned_route``: the plan for the node ids a client
  names, or the error saying why not.
- ``placement`` — where a node about to join should serve (ADR-0019).
"""
