"""A hop's step, checked before the engine runs it: the hop's side of a request's validation.

The engine core (``engine.core.NodeService``) runs steps; what a step must
hold before it may run is the hop's to check, each refusal a 4xx naming the
requester's fault. As a frame is read, before any tensor work
(:func:`admit`, :func:`check_length`): the step's own fields against this
shard (``engine.admission.Admission.check_step``: layers, context, hidden
size, the tail's fields), its credentials (``Admission.admit_step``: the
signed plan or the session's capability), its byte count against its shape
and dtype. Then, in the step's own task (:func:`forward`): its values
finite (``engine.finite.arrived``, naming the sender that produced them),
its session (``Admission.session_for``) and its position in that session
(after a draft round, the position that cuts the rejected drafts off:
``NodeService.rewind``).
"""

from __future__ import annotations

from collections.abc import Mapping

from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.finite import arrived
from nodes_app.runtime.engine.trust import Grant
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.wire.entries import Choice, ForwardStep
from nodes_app.runtime.wire.tensors import body_length, tensor_from_bytes


def admit(service: NodeService, step: ForwardStep, credentials: Mapping[str, str]) -> Grant:
    """What ``step`` may do, from its fields and credentials alone; a refusal otherwise."""
    service.admission.check_step(step)
    return service.admission.admit_step(step, credentials)


def check_length(step: ForwardStep, body: bytes) -> None:
    """Refuse (400 ``bad_length``) a body that is not the step's shape × dtype long."""
    expected = body_length(step)
    if len(body) != expected:
        raise RuntimeRequestError(
            f"the step has {len(body)} bytes; its shape and dtype need {expected}",
            code="bad_length",
        )


async def forward(
    service: NodeService, step: ForwardStep, body: bytes, grant: Grant | None = None
) -> bytes | Choice:
    """One hop step: hidden states in, hidden states (or the chosen token) out.

    ``grant`` is what admission returned for the step's credentials: a new
    session keeps its capability and its plan's bounds, an existing one
    must hold the same capability.
    """
    service.admission.check_step(step)
    hidden = arrived(tensor_from_bytes(body, step.dtype, step.shape), step.sender)
    session = service.admission.session_for(step, grant)
    async with session.lock:
        if session.claimed:  # opened by a prefix claim: start where the route agreed
            service.settle(session, step.position)
        if session.draft_round is not None:  # the position says which drafts were kept
            await service.rewind(session, step.position)
        if step.position != session.position:
            raise RuntimeRequestError(
                f"session {step.session_id} is at position {session.position}, not {step.position}",
                code="position_mismatch",
            )
        return await service.hop_forward(session, step, hidden)
