"""The requests this tracker process streams from each head: the queue a new one joins.

A request's choices each stream from their route's head; the dashboard shows
how many other requests are ahead of a request at its head
(:meth:`HeadQueues.ahead`), as far as this tracker can see. There is one
:data:`HEAD_QUEUES` per process: every request of the process shares it.
"""

from __future__ import annotations

from collections import Counter, defaultdict


class HeadQueues:
    """Head endpoint → request id → how many of the request's streams are open there."""

    def __init__(self) -> None:
        self._streams: defaultdict[str, Counter[str]] = defaultdict(Counter)

    def joined(self, endpoint: str, request_id: str) -> None:
        """A stream of ``request_id`` opened at ``endpoint``."""
        self._streams[endpoint][request_id] += 1

    def left(self, endpoint: str, request_id: str) -> None:
        """A stream of ``request_id`` at ``endpoint`` ended, however it ended."""
        streams = self._streams[endpoint]
        streams[request_id] -= 1
        if streams[request_id] <= 0:
            del streams[request_id]
        if not streams:
            del self._streams[endpoint]

    def ahead(self, endpoint: str, request_id: str) -> int:
        """The other requests streaming from ``endpoint`` (a request's own choices are not
        its queue)."""
        return sum(1 for other in self._streams.get(endpoint, {}) if other != request_id)


HEAD_QUEUES = HeadQueues()
