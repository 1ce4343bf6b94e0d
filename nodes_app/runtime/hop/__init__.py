"""A downstream hop's side of a route: the link a head steps it over, and what it answers.

A frame's path through this package:

1. ``link_server``: ``serve_link`` accepts ``WS /v1/link`` and reads each
   frame (``wire.frames.decode_requests``); hellos, cancels, prefix claims
   (``prefix_claim``: open a session with the prompt's cached blocks,
   ADR-0027) and steps are answered in order.
2. ``link_guard``: who may keep a link and for how long (links per peer,
   first-frame and header bounds, the hello, refusal counts, idle and
   write timeouts); ``link_inbox`` reads ahead for a trusted link.
3. ``step_intake``: a step's checks, its fields and credentials
   (``admit``) and byte count as the frame is read, then in its own task
   its values finite, its session and position (``forward``), before the
   engine core runs it (``engine.core.NodeService.hop_forward``).
4. ``link_answers``: the answers written back to the head, in frames, with
   the link cut off when the head does not read them.

A hop answers only the head that sent the step: hops never talk to each
other.
"""
