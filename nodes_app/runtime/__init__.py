"""The node runtime: a shard of a causal LM held in torch and served over HTTP.

Everything under this package may import torch and transformers; nothing
else in the project may (the tracker never loads them; an import-linter
contract keeps the registry and ``nodes_app.shared`` from importing this
package). Importing the package itself is cheap: the heavy modules are
imported by the modules that use them.

The packages say which side of a route their code serves
(docs/adr/0025-runtime-by-side.md):

- ``head/``: hop 0's side. A ``POST /v1/generate``'s checks, the route
  driver that steps the generation along the route, the head's end of each
  hop link, its checks of every hop's answer, and the output processor
  that turns choices into SSE frames.
- ``hop/``: a downstream hop's side. The link server (``WS /v1/link``), who
  may keep a link (guard), its read-ahead inbox, the answers it writes back,
  and the checks a step passes before the engine runs it.
- ``engine/``: what both sides run a step through. Admission (sessions,
  KV reservations, the plan gate), the scheduler, a batch's run, the shard
  runner and its family adapters, KV caches, the sampler, the finiteness
  check; ``core.NodeService`` composes them for one node.
- ``loading/``: a shard from its weights. Reading the checkpoint, precision
  and quantisation, the tiny built-in model, memory footprints.
- ``wire/``: the link's codec. Its entries, the JSON frames, the compact
  binary frames, tensor bytes.

At the top, the process: ``__main__`` (``python -m nodes_app.runtime``) and
``node`` (load, serve, register and heartbeat; ``runnode`` calls it),
``server`` (the ASGI app and its routes), ``tracker_client`` (registration
and heartbeats), ``autoplace`` (``runnode`` without ``--layers``) and
``faults`` (what a request is refused with, and a node's own fault).

A generation's path: ``server`` → ``head.request_checks`` →
``head.route_driver.RouteDriver``, which per step runs the head's layers
(``engine.core`` → ``engine.scheduler`` → ``engine.step_batch`` →
``engine.runner``), then sends the hidden states to each downstream hop
over ``head.hop_links`` and checks its answer (``head.hop_answers``) before
the next hop gets it: a star, every hop answers the head. On each hop:
``hop.link_server`` → ``hop.step_intake`` → the same engine path → the
answer back on the link (``hop.link_answers``). The tail's choice becomes
text in ``head.output``.
"""
