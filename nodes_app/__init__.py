"""The node side of Meshnet, in three parts that import one way.

- The registry (this package's own modules: models, registration and
  heartbeat API, services, liveness, adding models, topology epochs, the
  nodes' Prometheus series,
  ``runnode``) runs in the tracker, under Django.
- What both sides import: ``nodes_app.protocol`` (the wire's declarations,
  standard library only) and ``nodes_app.shared`` (catalogue, families,
  weight sources, tokenizers, chat templates, grammars, signatures; no
  torch, no Django).
- ``nodes_app.runtime``: the node process, the only code that imports
  torch; it imports no Django, and nothing of the registry imports it
  (``runnode`` starts it inside ``handle()``).

These rules, and the one-way dependencies between apps, are checked by
``lint-imports`` (contracts in ``pyproject.toml``).
"""
