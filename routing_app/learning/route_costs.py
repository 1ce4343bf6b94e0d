"""What a request costs on each route, learned from the requests that completed there.

Per route (and per model, the routes together) :class:`RouteCostBook` keeps
weighted averages of what the tracker saw a completed request do:

- the seconds a **prompt token** took to compute: the time to the first token
  over the prompt tokens the route did not take from its prefix cache, from
  prompts of at least :data:`MIN_PREFILL_TOKENS` computed tokens (the first
  token's own step and the links' round trips are in that time, and spread
  over a few prompt tokens they would read as a slow prefill);
- the seconds an **answer token** took after the first, and how many tokens
  an answer has;
- how far **speculation** carried the answer (ADR-0028): drafts sent and
  accepted per answer token, as the route's head reported them.

Cache-aware routing weighs a request's prefill with the first three
(``routing_app.learning.prefix_memory``, ADR-0029); ``/v1/routing`` shows them
all. A request after a failover teaches no prompt cost (its time to first
token is not its last route's). The book is this tracker process's own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from routing_app.planning.route_plan import RoutePlan

# The least weight a new sample gets in an average: it follows the last few dozen.
COST_WEIGHT_FLOOR = 0.2
MIN_PREFILL_TOKENS = 64


@dataclass(slots=True)
class Average:
    """A weighted average: a new sample weighs 1/(samples + 1), at least
    :data:`COST_WEIGHT_FLOOR`; ``None`` before the first."""

    value: float | None = None
    mass: float = 0.0

    def add(self, sample: float) -> None:
        if self.value is None:
            self.value = sample
        else:
            weight = max(1.0 / (self.mass + 1.0), COST_WEIGHT_FLOOR)
            self.value += weight * (sample - self.value)
        self.mass += 1.0


@dataclass(frozen=True, slots=True)
class RouteCosts:
    """A route's learned costs (``None``: not learned yet)."""

    prompt: float | None = None  # seconds per prompt token computed
    answer: float | None = None  # seconds per answer token after the first
    answer_tokens: float | None = None  # tokens per answer
    drafted: float | None = None  # drafts sent per answer token
    accepted: float | None = None  # drafts accepted per answer token


@dataclass(slots=True)
class _Learned:
    prompt: Average = field(default_factory=Average)
    answer: Average = field(default_factory=Average)
    answer_tokens: Average = field(default_factory=Average)
    drafted: Average = field(default_factory=Average)
    accepted: Average = field(default_factory=Average)


class RouteCostBook:
    """Each route's and each model's learned costs (thread-safe: the chat proxy records
    while the choice and ``/v1/routing`` read)."""

    def __init__(self) -> None:
        self._routes: dict[tuple[str, str], _Learned] = {}
        self._models: dict[str, _Learned] = {}
        self._lock = threading.Lock()

    def timed(
        self,
        *,
        plan: RoutePlan,
        prompt_computed: int,
        first_token_seconds: float | None,
        output_tokens: int,
        seconds: float,
        drafted: int = 0,
        accepted: int = 0,
    ) -> None:
        """A request completed on ``plan`` in ``seconds``: its first token after
        ``first_token_seconds`` (None: not known, e.g. after a failover) having computed
        ``prompt_computed`` prompt tokens, then ``output_tokens`` in all, of which the head
        drafted ``drafted`` and the last hop accepted ``accepted``."""
        with self._lock:
            learned = (
                self._routes.setdefault((plan.model_key, plan.signature), _Learned()),
                self._models.setdefault(plan.model_key, _Learned()),
            )
            for costs in learned:
                costs.answer_tokens.add(float(output_tokens))
                if output_tokens > 0:
                    costs.drafted.add(drafted / output_tokens)
                    costs.accepted.add(accepted / output_tokens)
                if first_token_seconds is None or first_token_seconds <= 0:
                    continue
                if prompt_computed >= MIN_PREFILL_TOKENS:
                    costs.prompt.add(first_token_seconds / prompt_computed)
                if output_tokens > 1 and seconds > first_token_seconds:
                    costs.answer.add((seconds - first_token_seconds) / (output_tokens - 1))

    def costs(self, plan: RoutePlan) -> RouteCosts:
        """``plan``'s learned costs: its prompt and answer token costs falling back on its
        model's routes' together, its answers' length the model's, its speculation its own."""
        with self._lock:
            own = self._routes.get((plan.model_key, plan.signature), _Learned())
            model = self._models.get(plan.model_key, _Learned())
            return RouteCosts(
                prompt=own.prompt.value if own.prompt.value is not None else model.prompt.value,
                answer=own.answer.value if own.answer.value is not None else model.answer.value,
                answer_tokens=model.answer_tokens.value,
                drafted=own.drafted.value,
                accepted=own.accepted.value,
            )


_route_costs = RouteCostBook()


def route_costs() -> RouteCostBook:
    """This process's book of route costs."""
    return _route_costs
