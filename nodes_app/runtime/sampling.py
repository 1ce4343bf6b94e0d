"""Choosing the next token on the last hop: greedy, temperature, top-k, top-p, seeded."""

from __future__ import annotations

import torch

# The JSON/header form of the parameters is the protocol's; only the torch
# side of sampling lives here.
from nodes_app.protocol import SamplingParams
from nodes_app.runtime.errors import NonFiniteOutput

__all__ = ["SamplingParams", "new_generator", "sample_token"]

# A temperature this close to 0 would turn float32 scores into 0/0; below it
# the draw is the greedy one anyway (every other token's weight underflows).
_MIN_TEMPERATURE = 1e-30


def new_generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token id from float32 ``logits`` of shape ``[vocab]``.

    Raises :class:`NonFiniteOutput` when a logit is NaN or infinite: argmax
    would answer token 0 for NaN logits, a plausible token from a broken
    computation, and the node that computed them is the one at fault.
    """
    if not bool(torch.isfinite(logits).all()):
        raise NonFiniteOutput("the logits are not finite")
    if params.greedy:
        return int(torch.argmax(logits))
    # Shifted so the best score is 0: dividing by a small temperature then
    # sends the others towards -inf (weight 0) instead of overflowing to NaN.
    scores = (logits - logits.max()) / max(params.temperature, _MIN_TEMPERATURE)
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        threshold = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < threshold, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True)
        probabilities = torch.softmax(ordered, dim=-1)
        # Drop tokens once the mass before them already reaches top_p; the best
        # token is always kept, whatever top_p rounds to in float32.
        drop = probabilities.cumsum(dim=-1) - probabilities >= params.top_p
        drop[0] = False
        scores = scores.scatter(0, order[drop], float("-inf"))
    probabilities = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probabilities, 1, generator=generator))
