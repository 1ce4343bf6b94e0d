"""The requests this tracker process streams from each head: the queue a new one joins.

A request's choices each stream from their route's head; the dashboard shows
how many other requests are ahead of a request at its head
(:meth:`HeadQueues.ahead`), as far as this tracker can see. The sessions this
tracker has open on each node are counted too (:meth:`HeadQueues.node_sessions`):
what explains a node's "busy" (:mod:`~tracker_app.completions.busy_claims`). A
stream counts there only once the node holds a session for it — the head once
it answered 200, every other hop once the route served a token — never while it
is only queued: streams retrying on a head that falsely answers busy must not
explain each other's busy answers. There is one :data:`HEAD_QUEUES` per
process: every request of the process shares it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable


class HeadQueues:
    """Head endpoint → request id → how many of the request's streams are open there,
    and node id → sessions this tracker's streams hold on it."""

    def __init__(self) -> None:
        self._streams: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self._sessions: Counter[str] = Counter()

    def joined(self, endpoint: str, request_id: str) -> None:
        """A stream of ``request_id`` opened at ``endpoint`` (queued, or under way)."""
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

    def sessions_opened(self, nodes: Iterable[str]) -> None:
        """A stream now holds a session on each of ``nodes``."""
        self._sessions.update(nodes)

    def sessions_closed(self, nodes: Iterable[str]) -> None:
        """A stream's sessions on ``nodes`` (as opened) are over."""
        for node in nodes:
            self._sessions[node] -= 1
            if self._sessions[node] <= 0:
                del self._sessions[node]

    def node_sessions(self, node_id: str) -> int:
        """The sessions this tracker's streams hold on ``node_id``, every request's."""
        return self._sessions.get(node_id, 0)


HEAD_QUEUES = HeadQueues()
