"""Prefix reuse across real node processes: a 2-node split of the tiny model, dev-open.

The same long prompt twice in one scope: the second answer is the first's, the
head reports the prompt positions it did not recompute (``cached_tokens``),
and the tail counts a hit of its own (its open health page). Another scope,
or none, reuses nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.nodes import TINY, generate_body, read_stream, running_nodes
from tests.support.sse import completion
from tracker_app.localnet import NodeProcess, wait_until

# Byte-level tokens: several blocks of 32 shared by every request below.
SYSTEM = "You are a careful assistant. Answer briefly and cite nothing. " * 4


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, NodeProcess]]:
    tmp: Path = tmp_path_factory.mktemp("prefix-nodes")
    layouts = {"head": (0, 1), "tail": (2, 3)}
    with running_nodes(tmp, TINY, layouts, prefix="prefix", timeout=120) as nodes:
        yield nodes


def ask(nodes: dict[str, NodeProcess], scope: str | None) -> tuple[list[int], dict[str, Any]]:
    """A greedy completion of the shared prompt on the split: its tokens and usage, once
    both nodes have ended its sessions (and kept what they may)."""
    head, tail = nodes["head"], nodes["tail"]
    body = generate_body([(head, 0, 1), (tail, 2, 3)], content=SYSTEM, max_tokens=8)
    if scope is not None:
        body["plan"]["prefix_scope"] = scope
    _, ids, last = completion(read_stream(head.endpoint, body))
    wait_until(lambda: tail.health()["active_sessions"] == 0)
    return ids, last["usage"]


def test_the_same_long_prompt_twice_reuses_its_prefix_on_every_hop(
    split: dict[str, NodeProcess],
) -> None:
    tail = split["tail"]
    first_ids, first = ask(split, "key:one")
    hits = tail.health()["prefix_hits"]

    second_ids, second = ask(split, "key:one")

    assert second_ids == first_ids
    assert "cached_tokens" not in first
    assert second["prompt_tokens"] == first["prompt_tokens"] > 64
    assert 0 < second["cached_tokens"] < second["prompt_tokens"]
    assert second["cached_tokens"] % 32 == 0
    health = tail.health()
    assert health["prefix_hits"] == hits + 1  # the tail started past the cached blocks too
    assert health["prefix_cache_load"] > 0
    assert "prefix_cache" not in health  # the exact figures stay off the open page


def test_another_scope_or_none_reuses_nothing(split: dict[str, NodeProcess]) -> None:
    reference, _ = ask(split, "key:two")

    answers = [ask(split, "key:three"), ask(split, None), ask(split, None)]

    assert all(ids == reference for ids, _ in answers)
    assert all("cached_tokens" not in usage for _, usage in answers)
