"""How many drafts a head sends through its route: chosen from what it measures (ADR-0028).

A draft round sends the last accepted token and ``k`` drafts as one step;
it delivers the accepted drafts plus one token. Whether that pays depends on
the route and on the text:

- **the route's timing**, per route on this head (:class:`RouteTiming`): the
  seconds of a one-position step (``plain``: the route's round trips plus
  every hop's decode) and the seconds each draft adds to a step
  (``per_draft``: the extra positions' compute, nearly nothing on a GPU or
  a memory-bound CPU model, more on a compute-bound one);
- **the text's acceptance**, per generation (:class:`DraftPolicy`): the share
  of drafts accepted so far, counted as a draft's chance ``a`` of being
  accepted given the ones before it were (with one accepted and one rejected
  draft assumed before any is seen).

A round of ``k`` drafts is then expected to deliver ``1 + a + … + a^k``
tokens in ``plain + k × per_draft`` seconds; the head drafts the ``k`` (up to
:data:`MAX_DRAFTS`) with the best expected tokens per second, and none when
that is not at least :data:`PAYS` times plain decoding's ``1 / plain``. On a
fast loopback route a step costs about its compute, so ``per_draft`` weighs
heavily and ``k`` falls to 0; over a slow link ``plain`` is mostly waiting,
and a text that repeats itself is worth several drafts. Until a route has a
plain step and a draft round measured, and every :data:`PROBE_EVERY` plain
steps while ``k`` is 0, one round of :data:`PROBE_DRAFTS` drafts measures
again (a probe costs one step's extra positions).

A head with a draft model has two proposers, each with its policy over its
own timing of the route (a draft model's drafts cost its compute, prompt
lookup's nearly nothing) and its own acceptance: each step asks the one
whose plan promises more (:meth:`DraftPolicy.plan`), a probe first.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

# Drafts per round at most: a round's step is a short prefill, and acceptance
# rarely runs longer than this on prompt-lookup drafts.
MAX_DRAFTS = 8
# A round must promise at least this many times plain decoding's tokens per second.
PAYS = 1.05
# Drafts of a round that measures (the route's first, and a probe while k is 0).
PROBE_DRAFTS = 3
# Plain steps between two probes of a generation that does not speculate.
PROBE_EVERY = 32
# Weight of the newest measurement in a route's timing.
TIMING_ALPHA = 0.2
# Routes a head keeps timing for (least recently used forgotten first).
ROUTES_KEPT = 256
# The proposers a route is timed for apart: a draft model's drafts cost its compute.
LOOKUP = "lookup"
DRAFT_MODEL = "draft model"


@dataclass
class RouteTiming:
    """A route's measured step times on this head (exponentially weighted, seconds)."""

    plain: float | None = None
    per_draft: float | None = None

    def record_plain(self, seconds: float) -> None:
        """A one-position step took ``seconds``."""
        self.plain = _blend(self.plain, seconds)

    def record_round(self, drafts: int, seconds: float) -> None:
        """A step with ``drafts`` drafts took ``seconds`` (measured once ``plain`` is known)."""
        if self.plain is None or drafts <= 0:
            return
        self.per_draft = _blend(self.per_draft, max(0.0, seconds - self.plain) / drafts)


class TimingBook:
    """Each route's :class:`RouteTiming` on this head, by the route's hops and the proposer
    (:data:`LOOKUP` or :data:`DRAFT_MODEL`) whose drafts it times."""

    def __init__(self, kept: int = ROUTES_KEPT) -> None:
        self.kept = kept
        self._routes: OrderedDict[Hashable, RouteTiming] = OrderedDict()

    def of(self, route: Hashable, proposer: str = LOOKUP) -> RouteTiming:
        key = (route, proposer)
        timing = self._routes.pop(key, None) or RouteTiming()
        self._routes[key] = timing
        while len(self._routes) > self.kept:
            self._routes.popitem(last=False)
        return timing


class DraftPolicy:
    """One generation's choice of how many drafts to send, over its route's ``timing``."""

    def __init__(self, timing: RouteTiming) -> None:
        self.timing = timing
        self.accepted = 0
        self.rejected = 0
        self._plain_since_round = 0

    @property
    def acceptance(self) -> float:
        """A draft's chance of being accepted after the ones before it were."""
        return (self.accepted + 1) / (self.accepted + self.rejected + 2)

    def drafts(self) -> int:
        """How many drafts the next step should carry (0: a plain step)."""
        return self.plan()[0]

    def plan(self) -> tuple[int, float]:
        """The next step's drafts and the tokens a second they are expected to deliver.

        A probe (a draft's cost not yet measured, or due while none pays) is
        expected at infinity: it is measured before anything that is known.
        """
        timing = self.timing
        if timing.plain is None:
            return 0, 0.0
        if timing.per_draft is None:
            return PROBE_DRAFTS, math.inf
        best = best_drafts(self.acceptance, timing.plain, timing.per_draft)
        if best == 0 and self._plain_since_round >= PROBE_EVERY:
            return PROBE_DRAFTS, math.inf
        return best, expected_rate(self.acceptance, timing.plain, timing.per_draft, best)

    def record_plain(self, seconds: float) -> None:
        self.timing.record_plain(seconds)
        self._plain_since_round += 1

    def record_round(self, drafts: int, accepted: int, seconds: float) -> None:
        """A round of ``drafts`` drafts accepted ``accepted`` of them in ``seconds``."""
        self.timing.record_round(drafts, seconds)
        self.accepted += accepted
        self.rejected += 1 if accepted < drafts else 0
        self._plain_since_round = 0


def best_drafts(acceptance: float, plain: float, per_draft: float) -> int:
    """The drafts per round with the most expected tokens per second; 0 unless it pays.

    A round of ``k`` drafts delivers ``1 + a + … + a^k`` tokens expected
    (``a``: ``acceptance``) in ``plain + k × per_draft`` seconds.
    """
    best, best_rate = 0, PAYS / plain
    for k in range(1, MAX_DRAFTS + 1):
        rate = expected_rate(acceptance, plain, per_draft, k)
        if rate > best_rate:
            best, best_rate = k, rate
    return best


def expected_rate(acceptance: float, plain: float, per_draft: float, drafts: int) -> float:
    """Tokens a second a step of ``drafts`` drafts is expected to deliver:
    ``1 + a + … + a^k`` in ``plain + k × per_draft`` seconds."""
    expected = sum(acceptance**k for k in range(drafts + 1))
    return expected / (plain + drafts * per_draft)


def _blend(old: float | None, sample: float) -> float:
    return sample if old is None else old + TIMING_ALPHA * (sample - old)
