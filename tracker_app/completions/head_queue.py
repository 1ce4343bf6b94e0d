"""The requests this tracker process streams from each head: the queue a new one joins.

A request's choices each stream from their route's head; the dashboard shows
how many other requests are ahead of a request at its head
(:meth:`HeadQueues.ahead`), as far as this tracker can see. The streams on
every node of their routes are counted too (:meth:`HeadQueues.node_streams`):
what explains a node's "busy" (:mod:`~tracker_app.completions.busy_claims`).
There is one :data:`HEAD_QUEUES` per process: every request of the process
shares it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence


class HeadQueues:
    """Head endpoint → request id → how many of the request's streams are open there,
    and node id → streams open on a route through it."""

    def __init__(self) -> None:
        self._streams: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self._nodes: Counter[str] = Counter()

    def joined(self, endpoint: str, request_id: str, nodes: Sequence[str] = ()) -> None:
        """A stream of ``request_id`` opened at ``endpoint``, on a route through ``nodes``."""
        self._streams[endpoint][request_id] += 1
        self._nodes.update(nodes)

    def left(self, endpoint: str, request_id: str, nodes: Sequence[str] = ()) -> None:
        """A stream of ``request_id`` at ``endpoint`` ended, however it ended."""
        streams = self._streams[endpoint]
        streams[request_id] -= 1
        if streams[request_id] <= 0:
            del streams[request_id]
        if not streams:
            del self._streams[endpoint]
        self._nodes.subtract(nodes)
        for node in nodes:
            if self._nodes[node] <= 0:
                del self._nodes[node]

    def ahead(self, endpoint: str, request_id: str) -> int:
        """The other requests streaming from ``endpoint`` (a request's own choices are not
        its queue)."""
        return sum(1 for other in self._streams.get(endpoint, {}) if other != request_id)

    def node_streams(self, node_id: str) -> int:
        """The streams open on routes through ``node_id``, every request's."""
        return self._nodes.get(node_id, 0)


HEAD_QUEUES = HeadQueues()
