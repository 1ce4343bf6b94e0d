"""Choosing the next token on the last hop: greedy, temperature, top-k, top-p, seeded."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import torch

from nodes_app.runtime.errors import RuntimeRequestError


@dataclass(frozen=True)
class SamplingParams:
    """``temperature`` 0 (or ``top_k`` 1) is greedy; ``seed`` None draws a fresh seed."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1

    def to_header(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_mapping(cls, data: Any) -> SamplingParams:
        if not isinstance(data, dict):
            raise RuntimeRequestError("sampling parameters must be an object", code="bad_sampling")
        try:
            params = cls(
                temperature=float(data.get("temperature", 0.0)),
                top_p=float(data.get("top_p", 1.0)),
                top_k=int(data.get("top_k", 0)),
                seed=None if data.get("seed") is None else int(data["seed"]),
            )
        except (TypeError, ValueError):
            raise RuntimeRequestError(
                "sampling parameters must be numbers", code="bad_sampling"
            ) from None
        if params.temperature < 0 or not 0 < params.top_p <= 1 or params.top_k < 0:
            raise RuntimeRequestError(
                "need temperature >= 0, 0 < top_p <= 1, top_k >= 0", code="bad_sampling"
            )
        return params

    @classmethod
    def from_header(cls, value: str) -> SamplingParams:
        try:
            data = json.loads(value)
        except ValueError:
            raise RuntimeRequestError(
                "X-Meshnet-Sampling is not JSON", code="bad_sampling"
            ) from None
        return cls.from_mapping(data)


def new_generator(seed: int | None) -> torch.Generator:
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def sample_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> int:
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
