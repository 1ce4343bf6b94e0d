"""Every served family answers as transformers' ``generate`` with a prefix taken from the cache.

The family table of ``test_family_adapters.py`` again, with prefix reuse: on
tiny random checkpoints, whole and split in two (for the hybrid families
between linear-attention and full-attention layers), a first session fills
each node's :class:`PrefixCache`; a second whose prompt shares three blocks
with the first claims them on every node (``find``, ``agreed``, ``take``,
``truncate``: what a head and its hops do) and prefills only the rest. Its
greedy tokens must be transformers' and every step's log-probabilities within
1e-4. A hit and a miss then decode in one batch, each as transformers has it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from nodes_app.runtime.engine.kv import SessionKV, linear_state_bytes
from nodes_app.runtime.engine.prefix_cache import (
    PrefixCache,
    agreed,
    local_keys,
)
from nodes_app.runtime.engine.runner import ShardRunner
from nodes_app.runtime.loading.shard import load_shard
from nodes_app.shared.prefix_chain import block_hashes, chain_seed
from nodes_app.shared.sources import ModelSource
from tests.support.checkpoints import FAMILIES, LAYERS, tiny_checkpoint, transformers_greedy_each

BLOCK = 8
FIRST = [(7 * i + 3) % 250 for i in range(30)]
# Shares FIRST's first three blocks (24 positions), then differs.
SECOND = [*FIRST[:24], 11, 12, 13, 14, 15, 16]
# Nothing in common with either, and as long as SECOND (Llama 4 batches rows of one past).
OTHER = [(5 * i + 101) % 250 for i in range(30)]
STEPS = 6
SPLITS = {"whole": [(0, LAYERS - 1)], "two hops": [(0, 2), (3, LAYERS - 1)]}
SEED = chain_seed("tiny", "tenant-a", BLOCK)


@dataclass
class Node:
    """One node of a route: its runner, the layers it runs and its prefix cache."""

    runner: ShardRunner
    start: int
    end: int
    cache: PrefixCache = field(default_factory=lambda: PrefixCache(block=BLOCK))

    def keys(self, hashes: list[str]) -> list[bytes]:
        return local_keys(
            hashes, model="tiny", start=self.start, end=self.end, dtype="float32", scope="s"
        )

    def new_state(self) -> SessionKV:
        kv = self.runner.new_cache()
        if linear_state_bytes(self.runner.shard, self.start, self.end):
            kv.snapshot_block = BLOCK  # as admission opens a prefix-caching session
        return kv


def route(directory: Path, ranges: list[tuple[int, int]]) -> list[Node]:
    source = ModelSource("directory", str(directory))
    return [
        Node(
            ShardRunner(
                load_shard(model_key="tiny", source=source, start=start, end=end, progress=False)
            ),
            start,
            end,
        )
        for start, end in ranges
    ]


def generate(
    nodes: list[Node], rows: list[list[SessionKV]], prompts: list[list[int]], starts: list[int]
) -> list[tuple[list[int], torch.Tensor]]:
    """Greedy tokens and logits of each row: its prefill alone from ``starts[row]``, then
    every row decoded in one batch."""
    nexts, logits = [], []
    for states, prompt, start in zip(rows, prompts, starts, strict=True):
        # In chunks ending on the prompt's last block boundary, where the scheduler
        # ends one for a session whose linear-attention states are snapshotted.
        boundary = len(prompt) // BLOCK * BLOCK
        stops = [boundary] if start < boundary < len(prompt) else []
        for first, end in zip([start, *stops], [*stops, len(prompt)], strict=True):
            ids = prompt[first:end]
            hidden = nodes[0].runner.embed(ids)
            for node, kv in zip(nodes, states, strict=True):
                hidden = node.runner.run_layers(
                    hidden, cache=kv, start=node.start, end=node.end, position=first, token_ids=ids
                )
        last = nodes[-1].runner.last_logits(hidden)[0]
        logits.append([last])
        nexts.append(int(last.argmax()))
    tokens = [[token] for token in nexts]
    for step in range(STEPS - 1):
        step_ids = [[row[-1]] for row in tokens]
        hidden = torch.cat([nodes[0].runner.embed(row) for row in step_ids])
        for index, node in enumerate(nodes):
            hidden = node.runner.run_batch(
                hidden,
                caches=[states[index] for states in rows],
                pasts=[len(prompt) + step for prompt in prompts],
                start=node.start,
                end=node.end,
                token_ids=step_ids,
            )
        for row, last in enumerate(nodes[-1].runner.last_logits(hidden)):
            logits[row].append(last)
            tokens[row].append(int(last.argmax()))
    return [(row, torch.stack(steps)) for row, steps in zip(tokens, logits, strict=True)]


def fill(nodes: list[Node], prompt: list[int]) -> None:
    """A first session runs ``prompt`` and ends cleanly: each node keeps what it ran."""
    states = [node.new_state() for node in nodes]
    ((tokens, _),) = generate(nodes, [states], [prompt], [0])
    ran = prompt + tokens[:-1]  # the last token chosen is never run
    hashes = block_hashes(SEED, ran, BLOCK)
    for node, kv in zip(nodes, states, strict=True):
        assert node.cache.keep(kv, node.keys(hashes), room=2**30)


def claim(nodes: list[Node], prompt: list[int]) -> tuple[list[SessionKV], int]:
    """A new session's claim on every node: the states it starts with and where it starts."""
    usable = (len(prompt) - 1) // BLOCK * BLOCK
    hashes = block_hashes(SEED, prompt[:usable], BLOCK)
    hits = [node.cache.find(node.keys(hashes)) for node in nodes]
    start = agreed(hits) * BLOCK
    states = []
    for node, hit in zip(nodes, hits, strict=True):
        kv = node.new_state()
        node.cache.take(hit, kv)
        kv.truncate(start)
        states.append(kv)
    return states, start


def assert_as_transformers(
    answer: tuple[list[int], torch.Tensor], expected: tuple[list[int], torch.Tensor]
) -> None:
    assert answer[0] == expected[0]
    torch.testing.assert_close(
        answer[1].log_softmax(-1), expected[1].log_softmax(-1), rtol=0, atol=1e-4
    )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_prompt_sharing_cached_blocks_generates_what_transformers_generates(
    checkpoints: dict[str, Path], family: str
) -> None:
    torch.set_num_threads(1)
    directory = checkpoints[family]
    if not directory.exists():
        tiny_checkpoint(family, directory)
    second, other = transformers_greedy_each(directory, [SECOND, OTHER], STEPS)

    for split, ranges in SPLITS.items():
        nodes = route(directory, ranges)
        fill(nodes, FIRST)

        states, start = claim(nodes, SECOND)
        assert start == 24, split  # three blocks not recomputed, on every node
        (answer,) = generate(nodes, [states], [SECOND], [start])
        assert_as_transformers(answer, second)

        # A hit and a miss prefill apart, then decode in one batch.
        hit, start = claim(nodes, SECOND)
        miss, nothing = claim(nodes, OTHER)
        assert (start, nothing) == (24, 0), split
        hit_answer, miss_answer = generate(nodes, [hit, miss], [SECOND, OTHER], [start, 0])
        assert_as_transformers(hit_answer, second)
        assert_as_transformers(miss_answer, other)
