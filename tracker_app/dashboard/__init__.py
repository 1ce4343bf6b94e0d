"""The staff dashboard: its pages, the live websocket, and what is pushed to it.

``views`` renders the pages from ``snapshot``'s reads; ``consumer`` serves
``/ws/dashboard/`` (routed in ``websocket_urls``); ``live`` and
``outbox_relay`` push updates after requests and background jobs; ``chat``
lets a signed-in operator chat without an API key. The completion pipeline
never imports this package: it emits events the dashboard reads.
"""
