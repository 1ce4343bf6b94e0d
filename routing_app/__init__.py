"""Route enumeration, route statistics and choice, over the registry's nodes and models.

Routing reads ``nodes_app`` (nodes, catalogue, topology epochs) and is read by
``tracker_app``; it never imports either the other way round (``lint-imports``).
"""
