"""The tracker↔node protocol: everything that crosses between them, defined once.

Both sides import this package (the tracker builds a generate request and
parses the head's frames; the head parses the request and encodes the
frames), so the two can never disagree on a field, a header name or a limit.
It needs nothing but the standard library: no Django, no torch (an
import-linter contract holds it to that). docs/adr/0002-node-runtime.md has
the prose contract. Its modules, by what crosses:

- ``limits``: the limits both sides enforce, header names and paths (the hop
  link's ``/v1/link`` and frame limit), the step deadlines.
- ``errors``: :class:`~nodes_app.protocol.errors.ProtocolError` (the
  machine-readable ``code`` a node answers in its 400 and a message that
  names the field), the error frame codes, what may be relayed of an error.
- ``decoding``: how a JSON object is read into a declared shape, the one way
  the node API and the hop frames check their input.
- ``sampling``: the sampling parameters and their ranges.
- ``signed_plan``: the tracker's signed plan and a session's capability.
- ``generate``: the body of ``POST {head}/v1/generate``.
- ``usage`` and ``logprobs``: token counts and token logprobs in OpenAI's shape.
- ``frames``: the head's chunk and error frames; ``sse``: the stream they
  travel in.
- ``registration``: what a node reports about itself (its precision label).

The hop link's binary frame codec needs torch: ``nodes_app.runtime.wire``.
"""
