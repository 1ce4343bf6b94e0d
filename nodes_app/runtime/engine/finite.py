"""Whether computed values are numbers: the one check of a hop's output, and who is blamed.

A hop's output is checked by this one function wherever it is judged, each
time for a different party's fault:

- the node that computed it, before it leaves (:func:`own_output`: a
  ``NonFiniteOutput``, that node's 500 ``non_finite_output``), and the
  sampler on every logits row;
- the head, on a middle hop's answer before it relays it
  (``head.hop_answers.hidden_of``: that hop's ``hop_failed``);
- the next hop, on what arrives (:func:`arrived`: 400 ``non_finite_input``,
  naming the step's sender, the producer), since a head relays bytes it did
  not compute.
"""

from __future__ import annotations

import math

import torch

from nodes_app.runtime.faults import NonFiniteOutput, RuntimeRequestError


def all_finite(values: torch.Tensor) -> bool:
    """Whether every value is a number (no NaN, no infinity).

    One reduction and one read in the common case: a sum of finite values is
    finite unless it overflows, and a NaN or an infinity makes any sum NaN or
    infinite, so a finite sum proves every value finite. Only a non-finite
    sum (a real NaN, or an overflow of large finite values) is checked value
    by value. It runs on every step's input and output, and on every logits row.
    """
    if math.isfinite(float(values.sum())):
        return True
    return bool(torch.isfinite(values).all())


def own_output(hidden: torch.Tensor) -> torch.Tensor:
    """``hidden``, unless this node computed NaN or infinite values: never pass them on."""
    if not all_finite(hidden):
        raise NonFiniteOutput("the hidden states this node computed are not finite")
    return hidden


def arrived(hidden: torch.Tensor, sender: str | None) -> torch.Tensor:
    """``hidden`` as a step brought it, unless it holds NaN or infinite values.

    The requester relays another node's output: the refusal names that node,
    so the head blames the producer, not this hop and not the client.
    """
    if not all_finite(hidden):
        named = f"from {sender} " if sender else ""
        raise RuntimeRequestError(
            f"the hidden states sent {named}hold NaN or infinite values",
            code="non_finite_input",
        )
    return hidden
