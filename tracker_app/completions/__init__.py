"""A completion request's life on the tracker, from the client's body to its answer
(ADR-0017). Imports follow the request's path: a stage imports those it hands work to,
never the one that called it (only ``consumer`` imports ``proxy``, only ``proxy``
imports ``admission`` and ``finishing``); none imports the dashboard.

In the order a request meets them:

- ``consumer`` — the endpoints over Channels: parse, run the proxy, render its result.
- ``chat_request``, ``text_request``, ``messages_request``, ``responses_request`` —
  each API's request as Meshnet accepts it, read into ``parameters.GenerationParams``
  (with ``structured`` and ``tools``: the grammar the answer follows).
- ``proxy`` — ``CompletionProxy``, which only orchestrates: admit the request, run
  its choices at once, finish it; ``proxy_terms`` is what it takes and gives.
- ``admission`` — count the prompts (``prompt_tokens``), take the key's share,
  choose the route, open the record.
- ``generation`` — one choice: what it produced, on which routes; ``interleaving``
  reads the choices as one stream.
- ``head_stream`` — one head's request and frames; ``head_queue``, ``slots``,
  ``busy_claims`` and ``deadline`` — waiting for a head, and how long a request may.
- ``failover`` — a hop failed: ban once per request, re-route, replay the tokens.
- ``finishing`` — ``RequestFinish``: the request ended once, what it owes;
  ``recording`` writes its records and bills it.
- ``answers`` and ``chat_answer``, ``text_answer``, ``messages_answer``,
  ``responses_answer`` — each API's answer; ``shapes`` declares every shape once,
  ``schema`` documents them.
- ``console`` and ``progress`` — the events the pipeline emits for the Call wall;
  ``upstream`` — the connection pool to the heads.
"""
