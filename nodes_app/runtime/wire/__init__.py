"""The hop link's codec: one binary frame per websocket message, head → hop and back.

- ``entries``: what travels (a step, a cancel, a hello, an answer; the
  tail's choice and an echo's prompt table) and how a step's fields are read.
- ``frames``: the frame API (``encode_requests``, ``decode_requests``,
  ``encode_answers``, ``decode_answers``) and the general JSON form.
- ``compact``: the binary header of a steady decode step and a token answer.
- ``tensors``: the dtypes that travel and a tensor's raw bytes.

The codec imports nothing of the engine (no sampler): the format only.
"""
