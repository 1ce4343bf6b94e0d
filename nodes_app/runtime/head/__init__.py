"""The head's side of a route: hop 0 drives a generation and streams it to the tracker.

A ``POST /v1/generate``'s path through this package:

1. ``request_checks``: the body parsed (``protocol.generate``), then this
   node's own checks: is it hop 0 of a plan it can run, the model, the
   prompt's caps, the resumed ids, the plan's grant (``HeadIdentity``,
   ``check_grant``).
2. ``route_driver``: ``prompt_for`` tokenises on the torch thread;
   ``RouteDriver`` opens the head's session and, per step, runs the head's
   own layers through the engine, then each downstream hop in order. A
   decode step may be a draft round (ADR-0028): ``drafts`` proposes the
   tokens (prompt lookup), ``speculation`` how many the route's measured
   timing and the answer's acceptance say pay.
3. ``hop_links``: the head's end of one persistent link per hop endpoint
   (``HopLinks``): steps queued in one loop tick leave as one frame, each
   step waits for its own answer within its deadline.
4. ``hop_answers``: what an answer must hold before the head relays it to
   the next hop or uses it: a middle hop's hidden states decoded and
   checked (shape, dtype, length, finite), a tail's token and scores.
   A bad answer is that hop's ``hop_failed``.
5. ``output``: the tail's choices become SSE chunks (``OutputProcessor``),
   with ``text`` for incremental detokenising, stop strings and how a
   token is written in logprobs.
"""
