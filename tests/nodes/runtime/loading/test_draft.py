"""A head loads its draft model whole (ADR-0028): the one the tracker names, or the operator's
``--draft-weights``; one of another tokenizer is refused and the head drafts without it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest

from nodes_app.protocol.registration import DraftNamed
from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.trust import PlanGate
from nodes_app.runtime.loading.shard import load_shard
from nodes_app.runtime.node import NodeOptions, load_head_draft
from nodes_app.shared.sources import ModelSource
from tests.support.checkpoints import LAYERS


@pytest.fixture
def head(llama: Path) -> Iterator[NodeService]:
    source = ModelSource("directory", str(llama))
    shard = load_shard(model_key="tiny", source=source, start=0, end=2, progress=False)
    service = NodeService(shard, node_id="head", gate=PlanGate(dev_open=True), kv_budget=2**24)
    yield service
    service.close()


def load(service: NodeService, named: DraftNamed | None, draft_weights: str | None = None) -> str:
    """What the node prints loading its draft."""
    out = StringIO()
    options = NodeOptions(model="tiny", start=0, end=2, port=0, draft_weights=draft_weights)
    asyncio.run(load_head_draft(options, service, named, out))
    return out.getvalue()


def test_a_head_loads_the_draft_the_tracker_names_whole(head: NodeService, llama: Path) -> None:
    out = load(head, DraftNamed("tiny-draft", str(llama)))

    assert head.draft is not None
    assert (head.draft.shard.start, head.draft.shard.end) == (0, LAYERS - 1)
    assert out.startswith(f"draft model: loaded tiny-draft layers 0-{LAYERS - 1} of {LAYERS}")


def test_the_operators_draft_weights_come_before_the_trackers(
    head: NodeService, llama: Path, other_vocabulary: Path
) -> None:
    out = load(head, DraftNamed("tiny-draft", str(llama)), draft_weights=str(other_vocabulary))

    assert head.draft is None
    assert out == (
        "draft model tiny-draft not loaded: draft model tiny-draft has another tokenizer than "
        "the model's (2 of its 259 tokens under other ids): a draft must share the model's "
        "tokenizer\n"
    )


def test_without_a_draft_named_or_given_a_head_loads_none(head: NodeService) -> None:
    assert load(head, None) == ""
    assert head.draft is None
