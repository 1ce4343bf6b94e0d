"""A hop's answer to a prefix claim: open the session, say how much of the prompt it holds.

The head sends every downstream hop the chain of its prompt's block hashes
before the prefill (``wire.entries.ClaimEntry``; docs/adr/0027-prefix-reuse.md).
The claim is checked as the step that opens a session would be (its layers,
a signed plan naming this node for them, the positions it reserves:
``Admission.admit_claim``), then the session is opened and the longest
prefix of the chain this node holds for its layers is copied into it
(``NodeService.claim``). The answer says how many leading blocks that is and
whether the state can be resumed at that count only (linear-attention
layers). The session's first step then starts where the head says the whole
route agreed (``NodeService.settle``).

A signed plan without a ``prefix_scope`` keeps the request out of the
cache: its claim opens the session and answers 0 blocks.
"""

from __future__ import annotations

from collections.abc import Mapping

from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.trust import Grant
from nodes_app.runtime.wire.entries import ClaimEntry, StepAnswer


def admit(service: NodeService, entry: ClaimEntry, credentials: Mapping[str, str]) -> Grant:
    """What the claim may open, from its fields and credentials alone; a refusal otherwise."""
    return service.admission.admit_claim(
        entry.session_id, entry.start, entry.end, entry.reserve, credentials
    )


async def answer(service: NodeService, entry: ClaimEntry, grant: Grant) -> StepAnswer:
    """Open the claim's session (503 ``node_busy`` when the budget has no room even with
    the cache evicted) and answer the blocks it holds."""
    # A dev-open node has no signed scope: it trusts the chain as the head seeded it.
    scope = "" if grant.prefix_scope is None else grant.prefix_scope or None
    admission = service.admission
    session = admission.open_session(
        entry.session_id,
        entry.start,
        entry.end,
        grant=grant,
        reserve=admission.reservation(entry.reserve, granted=grant.max_positions or None),
        prefix=scope is not None,
    )
    try:
        hit = await service.claim(session, entry.hashes, scope)
    except BaseException:
        service.cancel(entry.session_id)
        raise
    return StepAnswer(entry.step_id, blocks=hit.blocks, exact=hit.exact)
