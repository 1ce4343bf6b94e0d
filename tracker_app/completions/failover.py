"""What a choice does when a hop of its route fails: ban the node, re-route, replay.

If a hop dies mid-generation the node is banned with exponential back-off
(:mod:`routing_app.exclusions.bans`; a success clears it) — once for the choices that
were on it together, whose streams all fail at once —, a new route is chosen
without it for each failed choice (:meth:`Failover.reroute`), and its
generation resumes on the new head by replaying the prompt plus every token
already produced (:func:`replay_request`; a choice's first send is built by
:func:`~tracker_app.completions.head_stream.head_request`): the client's
stream goes on with no gap and no repeated token. Each choice fails over on
its own, at most :data:`MAX_FAILOVERS` times; a pinned route never does
(:class:`UpstreamFailed`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from meshnet_site.database import database_call
from meshnet_site.errors import DomainError, ErrorKind
from nodes_app.models import LanguageModel
from nodes_app.protocol.generate import GenerateRequest
from routing_app.exclusions.bans import node_ban
from routing_app.policies.choice import RouteDecision
from routing_app.services import route_choose
from tracker_app.completions.generation import Generation
from tracker_app.completions.head_stream import HopFailure, head_request
from tracker_app.completions.parameters import GenerationParams

logger = logging.getLogger(__name__)

MAX_FAILOVERS = 3


class UpstreamFailed(DomainError):
    """A node failed and no failover was allowed (pinned route, or too many already)."""

    kind = ErrorKind.UPSTREAM
    code = "upstream_failed"


class Failover:
    """One request's failovers: which nodes it banned when, and the routes it moves to."""

    def __init__(
        self,
        *,
        request_id: str,
        model: LanguageModel,
        pinned: bool,
        clock: Callable[[], float],
    ) -> None:
        self.request_id, self.model, self.pinned, self.clock = request_id, model, pinned, clock
        # When this request last banned each node: the choices sharing a route all fail
        # when one of its nodes dies, and that is one failure of the node, not n.
        self._banned_at: dict[str, float] = {}

    async def reroute(self, generation: Generation, failure: HopFailure) -> RouteDecision:
        """Ban ``failure``'s node (unless this request just did, for a sibling choice) and
        choose ``generation``'s next route; :class:`UpstreamFailed` if it may not move."""
        generation.failovers += 1
        self._ban(generation, failure)
        if generation.failovers > MAX_FAILOVERS or self.pinned:
            why = "pinned route" if self.pinned else "too many failovers"
            raise UpstreamFailed(
                f"Node {failure.node_id} failed mid-generation ({failure.message}); "
                f"no failover ({why})"
            )
        # The replay's prompt starts as the first send's did: a route holding it is warm.
        asked = generation.sent.max_tokens if generation.sent is not None else 0
        prefix = generation.prompt_count.route_prefix(asked - len(generation.token_ids))
        return await database_call(route_choose)(model=self.model, prefix=prefix)

    def _ban(self, generation: Generation, failure: HopFailure) -> None:
        banned_at = self._banned_at.get(failure.node_id)
        if banned_at is None or generation.segments[-1].started > banned_at:
            ban = node_ban(node_id=failure.node_id)
            self._banned_at[failure.node_id] = self.clock()
            logger.warning(
                "request %s choice %d: hop %s failed (%s); banned for %.0f s",
                self.request_id,
                generation.choice,
                failure.node_id,
                failure.message,
                ban,
            )
        else:  # a sibling choice's failure, already banned for: only re-route
            logger.info(
                "request %s choice %d: hop %s failed (%s), as it did for another choice",
                self.request_id,
                generation.choice,
                failure.node_id,
                failure.message,
            )


def replay_request(
    generation: Generation,
    *,
    params: GenerationParams,
    request_id: str,
    lasts: float | None = None,
) -> GenerateRequest:
    """What the head of ``generation``'s route is sent to resume it (on a new route, or
    on its own after a wait for a slot): its prompt and every token it has produced so
    far, built and signed as every send is
    (:func:`~tracker_app.completions.head_stream.head_request`)."""
    return head_request(
        generation,
        params=params,
        request_id=request_id,
        lasts=lasts,
        resume_token_ids=generation.token_ids,
        echo=_echo_asked(generation, params),
    )


def _echo_asked(generation: Generation, params: GenerationParams) -> bool:
    """Whether this send of ``generation`` asks the head for the prompt's scores: until
    they were relayed (a route that fails before its first frame echoed nothing), and
    always when no token is asked (the head needs something to do)."""
    if not params.prompt_scored:
        return False
    return not generation.echoed or params.max_tokens == 0
