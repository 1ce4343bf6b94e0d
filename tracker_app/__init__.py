"""The tracker: the OpenAI-compatible API and what serves it.

One package per concern: ``completions`` (a request's life from the consumer
to the answer), ``billing`` (pricing and audits), ``dashboard`` (pages, the
live websocket and what it pushes), ``api_keys`` (client keys, their
authentication and rate limit) and ``localnet`` (the process harness behind
``meshnet_up``, tests and benchmarks). ``probes`` sends route-equivalence
probes; ``api`` and ``views`` are the plain read endpoints; ``tasks`` the
Celery jobs.
"""
