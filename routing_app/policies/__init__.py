"""The choice among a model's candidates: the route policies and what they read (ADR-0011).

In the order a request meets them:

- ``config`` — ``RoutePolicyConfig``: the ``MESHNET_ROUTE_*`` settings read
  at call time; ``route_policy()`` builds the policy they name, the one place
  a policy's name is compared.
- ``base`` — ``RoutePolicy`` (``choose``, ``shares``, ``scout_due``) and the
  guarantees every policy keeps: nothing kept out is chosen, and with no
  proven arm the best prior is taken.
- ``thompson`` — ``thompson-load``, the default: load-aware discounted
  Thompson sampling; ``adr0021`` — ADR-0021's scout at a share, exploit
  P ∝ tps^alpha.
- ``priors`` — beliefs about unmeasured routes from what is known of their
  nodes (ADR-0018).
- ``load`` — the load book: sessions in flight per route, opened in one step
  with the choice and closed when the stream ends.
- ``choice`` — ``RouteDecision`` (plan, mode, epoch), what ``route_choose``
  returns, and ``NoRouteAvailable``.
"""
