"""The engine: what every step runs through, on a head or a hop.

``core.NodeService`` composes the stages for one node; a step's path:

1. ``admission``: a step's field checks against the shard, the session it
   runs in, its KV reservation against the budget (``kv``), and the plan
   gate and capabilities (``trust``); ``sessions`` holds the sessions, and
   in the same budget ``prefix_cache`` holds what ended sessions computed,
   for the next prompt that starts the same (ADR-0027).
2. ``scheduler``: queues steps and decides which run together and when
   (continuous batching, chunked prefill, short batches on the loop).
3. ``step_batch``: runs one batch: rows through ``runner.ShardRunner``'s
   layers (``family_adapters``: what a model family needs beyond plain
   layers), then each job's outcome: the tail's choice (``sampler``) or a
   middle hop's hidden bytes, checked by ``finite``.

Also here: ``capacity`` (the scheduler's options), ``benchmark`` (a node's
decode speed at start). The engine imports neither ``head`` nor ``hop``.
"""
