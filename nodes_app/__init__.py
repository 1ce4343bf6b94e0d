"""Node registry (models, registration/heartbeat API, liveness), the model catalogue,
topology epochs, and the node runtime.

The runtime (``nodes_app.runtime``) is the only code that imports torch, and
it imports no Django; the tracker imports the registry side of this app only.
Both rules, and the one-way dependencies between apps, are checked by
``lint-imports`` (contracts in ``pyproject.toml``).
"""
