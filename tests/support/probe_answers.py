"""Probe answers for routing tests: a route's tokens and the logprobs behind each, and
route plans of a 4-layer model."""

from __future__ import annotations

from nodes_app.protocol.logprobs import TokenLogprob, TopLogprob
from routing_app.exclusions.probe_verdicts import ProbeAnswer
from routing_app.planning.route_plan import Hop, RoutePlan

RIGHT = ProbeAnswer(token_ids=(5, 6, 7, 8))
WRONG = ProbeAnswer(token_ids=(5, 6, 9, 9))
TOP = 5  # alternatives a head lists per token, as the probe asks


def spelled(token_id: int) -> tuple[str, tuple[int, ...]]:
    text = f"t{token_id}"
    return text, tuple(text.encode())


def step(scores: dict[int, float]) -> TokenLogprob:
    """A greedy head's entry for one position: its best token and its best alternatives."""
    best = sorted(scores, key=lambda token_id: (-scores[token_id], token_id))
    return entry(best[0], scores[best[0]], [(t, scores[t]) for t in best[:TOP]])


def entry(token_id: int, logprob: float, alternatives: list[tuple[int, float]]) -> TokenLogprob:
    token, utf8 = spelled(token_id)
    top = tuple(TopLogprob(*_written(t, lp)) for t, lp in alternatives)
    return TokenLogprob(token, logprob, utf8, top)


def _written(token_id: int, logprob: float) -> tuple[str, float, tuple[int, ...]]:
    token, utf8 = spelled(token_id)
    return token, logprob, utf8


def answer(*steps: dict[int, float]) -> ProbeAnswer:
    """A route's answer from the logprobs it saw at each position (greedy: the best is chosen)."""
    entries = tuple(step(scores) for scores in steps)
    return ProbeAnswer(token_ids=tuple(int(entry.token[1:]) for entry in entries), logprobs=entries)


SURE = {5: -0.01, 6: -5.0}
# float32 picks 7 by 0.05 nats; a bfloat16 head tips it to 8 by 0.04.
TIE_FLOAT32 = {7: -0.70, 8: -0.75, 9: -4.0}
TIE_BFLOAT16 = {7: -0.74, 8: -0.70, 9: -4.0}
FLOAT32 = answer(SURE, TIE_FLOAT32, {1: -0.1, 2: -3.0})
MIXED = answer(SURE, TIE_BFLOAT16, {3: -0.2, 1: -2.5})
# A corrupt hop: sure of a token the honest route put 3 nats down.
CORRUPT = answer(SURE, {9: -0.05, 7: -3.2, 8: -3.5}, {2: -0.3})


def plan(*hops: tuple[str, int, int], model: str = "m") -> RoutePlan:
    return RoutePlan(model, 3, tuple(Hop(n, f"http://{n}", a, b) for n, a, b in hops))


FULL = plan(("full", 0, 3))
VIA_C = plan(("c", 0, 1), ("full", 2, 3))
SPLIT = plan(("h", 0, 1), ("t", 2, 3))
