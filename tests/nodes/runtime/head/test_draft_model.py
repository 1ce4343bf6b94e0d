"""A head's draft model (ADR-0028): what it proposes, how it rolls back, what it never changes.

Tiny random checkpoints of the same tokenizer: a Llama that serves the route
(split over a head and a hop in this process, ``tests/support/in_process_route``)
and drafts whole for itself, a Qwen3 that drafts for it and is mostly wrong,
and a Qwen3-Next whose linear-attention states go back only to where a
proposal began. The route's timing is fixed so that the draft model's drafts
pay and prompt lookup's do not, except where a test measures a draft's cost.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from nodes_app.runtime.engine.runner import ShardRunner
from nodes_app.runtime.head.drafts import DraftModel
from nodes_app.runtime.head.speculation import (
    DRAFT_MODEL,
    LOOKUP,
    PROBE_DRAFTS,
    RouteTiming,
    TimingBook,
)
from nodes_app.runtime.loading.shard import load_shard
from nodes_app.shared.sources import ModelSource
from nodes_app.shared.tokenization import TINY_VOCAB_SIZE
from tests.support.checkpoints import LAYERS, tiny_checkpoint, transformers_greedy
from tests.support.in_process_route import FixedTiming, InProcessRoute
from tests.support.sse import completion

PROMPT = "the mesh runs the layers; " * 4 + "the mesh"
PROMPT_IDS = [257, *range(60, 75), 258, 10]
TOKENS = 16


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("draft-model")
    return {family: tiny_checkpoint(family, root / family) for family in ("llama", "qwen3")}


def whole(directory: Path) -> ShardRunner:
    """The checkpoint loaded whole, as a head loads its draft model."""
    torch.set_num_threads(1)
    source = ModelSource("directory", str(directory))
    return ShardRunner(
        load_shard(model_key="draft", source=source, start=0, end=LAYERS - 1, progress=False)
    )


@pytest.fixture(scope="module")
def route(checkpoints: dict[str, Path]) -> Iterator[InProcessRoute]:
    served = InProcessRoute(checkpoints["llama"], [(0, 2), (3, LAYERS - 1)])
    yield served
    served.close()


class ModelDrafts(TimingBook):
    """Every route timed so that the draft model's drafts pay at once and prompt lookup's never."""

    def of(self, route: Any, proposer: str = LOOKUP) -> RouteTiming:
        return FixedTiming(1.0, 0.0 if proposer == DRAFT_MODEL else 10.0)


def test_a_draft_model_proposes_the_greedy_tokens_of_its_model(
    checkpoints: dict[str, Path],
) -> None:
    expected, _ = transformers_greedy(checkpoints["llama"], PROMPT_IDS, 8)

    draft = DraftModel(whole(checkpoints["llama"]), PROMPT_IDS, vocab=TINY_VOCAB_SIZE)

    assert draft.propose(8) == expected


@pytest.mark.parametrize("family", ["llama", "qwen3_next"])
def test_after_rejections_a_draft_proposes_what_a_fresh_one_given_the_same_text_does(
    family: str, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    """K/V is cut back past the rejected proposals; a linear-attention state goes back to
    where the proposal began and runs the kept tokens again."""
    directory = checkpoints.get(family) or tiny_checkpoint(family, tmp_path / family)
    runner = whole(directory)
    draft = DraftModel(runner, PROMPT_IDS, vocab=TINY_VOCAB_SIZE)

    def fresh(limit: int) -> list[int]:
        return DraftModel(runner, draft.tokens, vocab=TINY_VOCAB_SIZE).propose(limit)

    first = draft.propose(6)
    # Two accepted, the third rejected: the route chose another token there.
    draft.extend([*first[:2], (first[2] + 1) % 256])
    assert draft.propose(5) == fresh(5)
    # None accepted.
    draft.extend([(draft.propose(4)[0] + 1) % 256])
    assert draft.propose(4) == fresh(4)
    # Every one accepted, and the token after them.
    draft.extend([*draft.propose(3), 42])
    assert draft.propose(6) == fresh(6)


def test_a_draft_never_proposes_a_stop_token_nor_past_the_models_vocabulary(
    checkpoints: dict[str, Path],
) -> None:
    runner = whole(checkpoints["llama"])
    free = DraftModel(runner, PROMPT_IDS, vocab=TINY_VOCAB_SIZE).propose(8)

    stopped = DraftModel(runner, PROMPT_IDS, vocab=TINY_VOCAB_SIZE, stop_ids=[free[3]])
    narrower = DraftModel(runner, PROMPT_IDS, vocab=free[2])

    assert stopped.propose(8) == free[: free.index(free[3])]
    assert narrower.propose(8) == free[: next(i for i, t in enumerate(free) if t >= free[2])]


@pytest.mark.parametrize("drafter", ["llama", "qwen3"], ids=["itself", "another-model"])
def test_answers_are_the_same_with_the_draft_model_on_and_off(
    drafter: str, route: InProcessRoute, checkpoints: dict[str, Path]
) -> None:
    route.services[0].draft = whole(checkpoints[drafter])
    try:
        off = route.generate(route.body(PROMPT, max_tokens=TOKENS, speculation="off"))
        on = route.generate(route.body(PROMPT, max_tokens=TOKENS), timings=ModelDrafts())
        sampled: dict[str, Any] = {"max_tokens": TOKENS, "temperature": 0.5, "seed": 3}
        sampled_off = route.generate(route.body(PROMPT, speculation="off", **sampled))
        sampled_on = route.generate(route.body(PROMPT, **sampled), timings=ModelDrafts())
    finally:
        route.services[0].draft = None

    text, ids, last = completion(on)
    assert (text, ids) == completion(off)[:2]
    assert completion(sampled_on)[1] == completion(sampled_off)[1]
    usage = last["usage"]
    assert usage["completion_tokens"] == len(ids) == TOKENS
    assert usage["drafted_tokens"] > 0
    if drafter == "llama":
        # The model drafting for itself: its guesses are its answer.
        assert usage["accepted_tokens"] >= 0.9 * usage["drafted_tokens"]
        assert usage["drafted_tokens"] >= TOKENS // 2


class SlowDraft(ShardRunner):
    """A draft model that takes 100 ms a forward: dearer than the route's whole step."""

    def run_layers(self, hidden: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        time.sleep(0.1)
        return super().run_layers(hidden, **kwargs)


class SteadyPlain(RouteTiming):
    """A plain step timed at 20 ms (a slow link) whatever it measures; drafts measured."""

    def record_plain(self, seconds: float) -> None:
        return None


class SlowLink(TimingBook):
    """The draft model's drafts measured over :class:`SteadyPlain`; prompt lookup's never pay."""

    def __init__(self) -> None:
        super().__init__()
        self.model = SteadyPlain(plain=0.02)

    def of(self, route: Any, proposer: str = LOOKUP) -> RouteTiming:
        return self.model if proposer == DRAFT_MODEL else FixedTiming(0.02, 10.0)


def test_a_draft_models_compute_counts_in_a_rounds_cost_so_a_dear_one_stops_drafting(
    route: InProcessRoute, checkpoints: dict[str, Path]
) -> None:
    """Its own guesses are all accepted, but each costs five plain steps: after the round
    that measures them, the head decodes plainly."""
    llama = whole(checkpoints["llama"])
    route.services[0].draft = SlowDraft(llama.shard)
    timings = SlowLink()
    try:
        _, ids, last = completion(
            route.generate(route.body(PROMPT, max_tokens=TOKENS), timings=timings)
        )
    finally:
        route.services[0].draft = None

    # Three forwards of 100 ms for three drafts, less the plain step they replace.
    assert timings.model.per_draft is not None and timings.model.per_draft >= 0.09
    assert last["usage"]["drafted_tokens"] == PROBE_DRAFTS
    assert len(ids) == TOKENS
