"""Choosing the next token on the last hop: greedy, temperature, top-k, top-p, seeded."""

from __future__ import annotations

import torch

# The JSON/header form of the parameters is the protocol's; only the torch
# side of sampling lives here.
from nodes_app.protocol import SamplingParams

__all__ = ["SamplingParams", "new_generator", "sample_token"]


def new_generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token id from float32 ``logits`` of shape ``[vocab]``."""
    if params.greedy:
        return int(torch.argmax(logits))
    scores = logits / params.temperature
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        threshold = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < threshold, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(scores, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        # Drop tokens once the mass before them already reaches top_p (keep at least one).
        drop = cumulative - torch.softmax(ordered, dim=-1) >= params.top_p
        scores = scores.scatter(0, order[drop], float("-inf"))
    probabilities = torch.softmax(scores, dim=-1)
    return int(torch.multinomial(probabilities, 1, generator=generator))
