"""Node registry (models, registration/heartbeat API, liveness) and the node runtime.

The runtime (``nodes_app.runtime``) is the only code that imports torch; the
tracker imports the registry side of this app only.
"""
