"""What a hop refuses of a draft round's fields, from the step alone (ADR-0028).

``Admission.check_step``: what ``hop.step_intake`` checks before any tensor work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from nodes_app.protocol.sampling import SamplingParams
from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.trust import PlanGate
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.loading.shard import load_shard
from nodes_app.runtime.wire.entries import ForwardStep
from nodes_app.shared.sources import resolve_source
from tests.support.nodes import TINY

ROUND = ForwardStep(
    session_id="s",
    start=2,
    end=3,
    position=12,
    dtype="float32",
    shape=(1, 4, 64),
    sampling=None,
    drafts=(5, 6, 7),
)


@pytest.fixture(scope="module")
def tail() -> Iterator[NodeService]:
    torch.set_num_threads(1)
    shard = load_shard(model_key=TINY, source=resolve_source(TINY), start=2, end=3, progress=False)
    service = NodeService(shard, node_id="tail", gate=PlanGate(dev_open=True))
    yield service
    service.close()


@pytest.mark.parametrize("logprobs", [None, 2], ids=["unscored", "scored"])
def test_a_round_within_the_rules_is_admitted(tail: NodeService, logprobs: int | None) -> None:
    tail.admission.check_step(dataclasses.replace(ROUND, logprobs=logprobs))


@pytest.mark.parametrize(
    "changes",
    [
        {"position": 0, "sampling": SamplingParams()},  # a round never opens a session
        {"drafts": (5, 6, 10_000)},  # past the vocabulary
        {"generated_ids": (1,)},
    ],
    ids=["opening", "vocabulary", "generated-ids"],
)
def test_a_round_breaking_a_rule_is_refused_as_a_bad_field(
    tail: NodeService, changes: dict[str, object]
) -> None:
    with pytest.raises(RuntimeRequestError) as refused:
        tail.admission.check_step(dataclasses.replace(ROUND, **changes))  # type: ignore[arg-type]

    assert refused.value.code == "bad_field"
