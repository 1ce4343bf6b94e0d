"""A node's prefix cache: within its KV budget, least recently used out first, scoped, and exact.

Entries are ended sessions' real states; the budget is ``SessionStore``'s. The
node-level tests run sessions through ``NodeService`` as a head does (claim,
settle, the scheduler's steps, a clean end): the second session of a shared
prompt starts past the cached blocks and answers what the first answered.
"""

from __future__ import annotations

import asyncio
import zlib
from pathlib import Path

import pytest
import torch

from nodes_app.runtime.engine.core import NodeService
from nodes_app.runtime.engine.kv import SessionKV
from nodes_app.runtime.engine.prefix_cache import (
    Hit,
    PrefixCache,
    agreed,
    local_keys,
)
from nodes_app.runtime.engine.sampler import SamplingParams, TailRequest
from nodes_app.runtime.engine.sessions import SessionStore
from nodes_app.runtime.engine.trust import PlanGate
from nodes_app.runtime.faults import RuntimeRequestError
from nodes_app.runtime.loading.shard import load_shard
from nodes_app.runtime.wire.entries import Choice
from nodes_app.shared.prefix_chain import block_hashes, chain_seed
from nodes_app.shared.sources import ModelSource, resolve_source
from tests.support.checkpoints import tiny_checkpoint

BLOCK = 8
# Bytes one position takes in the synthetic states below: K and V, 2 heads × 4 dims, float32.
POSITION_BYTES = 2 * 2 * 4 * 4


def state(positions: int, fill: float = 0.0) -> SessionKV:
    """A session's K/V state holding ``positions`` positions of one layer."""
    kv = SessionKV(limit=positions)
    values = torch.full((1, 2, positions, 4), fill)
    kv.append(0, values, values)
    kv.ran(positions, prefill=True)
    return kv


def chain(name: str, blocks: int) -> list[bytes]:
    tokens = [zlib.crc32(f"{name}:{i}".encode()) % 250 for i in range(blocks * BLOCK)]
    hashes = block_hashes(chain_seed("m", "s", BLOCK), tokens, BLOCK)
    return local_keys(hashes, model="m", start=0, end=0, dtype="float32", scope="s")


def ended(store: SessionStore, name: str, blocks: int) -> None:
    """A session of ``blocks`` blocks opens, runs, and ends cleanly under its own chain."""
    positions = blocks * BLOCK
    session = store.create(
        name, start=0, end=0, cache=state(positions), reserved_bytes=positions * POSITION_BYTES
    )
    session.position = positions
    assert store.end(name, chain(name, blocks))


def test_a_churn_of_distinct_prompts_never_takes_the_node_over_its_budget() -> None:
    budget = 10 * 4 * BLOCK * POSITION_BYTES  # ten four-block entries
    store = SessionStore(kv_budget=budget, idle_timeout=60, prefix=PrefixCache(block=BLOCK))

    for i in range(40):
        ended(store, f"p{i}", 4)
        assert store.reserved + store.prefix.nbytes <= budget

    assert len(store.prefix) == 10
    assert store.prefix.evicted == 30
    # The newest are held, the oldest gone.
    assert store.prefix.find(chain("p39", 4)).blocks == 4
    assert store.prefix.find(chain("p0", 4)).blocks == 0


def test_a_live_session_is_admitted_by_evicting_cache_before_the_node_is_busy() -> None:
    budget = 4 * 4 * BLOCK * POSITION_BYTES
    store = SessionStore(kv_budget=budget, idle_timeout=60, prefix=PrefixCache(block=BLOCK))
    for i in range(4):
        ended(store, f"p{i}", 4)
    assert store.prefix.nbytes == budget

    store.create("live", start=0, end=0, cache=None, reserved_bytes=budget - POSITION_BYTES)

    assert store.reserved + store.prefix.nbytes <= budget
    assert len(store.prefix) == 0
    # Beyond the budget with nothing left to evict, the node is busy as before.
    with pytest.raises(RuntimeRequestError) as busy:
        store.create("more", start=0, end=0, cache=None, reserved_bytes=2 * POSITION_BYTES)
    assert (busy.value.status, busy.value.code) == (503, "node_busy")


def test_the_least_recently_used_entry_is_evicted_first() -> None:
    budget = 3 * 2 * BLOCK * POSITION_BYTES
    store = SessionStore(kv_budget=budget, idle_timeout=60, prefix=PrefixCache(block=BLOCK))
    for name in ("a", "b", "c"):
        ended(store, name, 2)
    assert store.prefix.find(chain("a", 2)).blocks == 2  # "a" used again: "b" is now oldest

    ended(store, "d", 2)

    held = {name: store.prefix.find(chain(name, 2)).blocks for name in "abcd"}
    assert held == {"a": 2, "b": 0, "c": 2, "d": 2}


def test_a_prompt_matching_part_of_an_entry_takes_its_leading_blocks_only() -> None:
    cache = PrefixCache(block=BLOCK)
    kv = state(3 * BLOCK, fill=1.5)
    keys = chain("x", 3)
    cache.keep(kv, keys, room=2**20)

    hit = cache.find([*keys[:2], *chain("y", 3)[2:]])
    taken = SessionKV()
    positions = cache.take(hit, taken)

    assert (hit.blocks, positions, taken.length(0)) == (2, 2 * BLOCK, 2 * BLOCK)
    assert cache.hits == 0  # counted once the route agrees (NodeService.settle)


def test_a_route_starts_where_every_node_can() -> None:
    # K/V alone resumes at any count up to what it holds; linear states only at theirs.
    assert agreed([Hit(3, False), Hit(2, False)]) == 2
    assert agreed([Hit(3, True), Hit(4, False)]) == 3
    assert agreed([Hit(3, True), Hit(2, False)]) == 0
    assert agreed([Hit(3, True), Hit(2, True)]) == 0
    assert agreed([Hit(0, False), Hit(5, True)]) == 0


# --- through a node's engine ----------------------------------------------------------

GREEDY = TailRequest(SamplingParams(temperature=0.0))
PROMPT = [257, *range(40, 70), 258, 10, 104, 105]  # 35 tokens: four blocks of 8 and some
STEPS = 5


def service_of(directory: Path | None = None, *, prefill_chunk: int = 128) -> NodeService:
    torch.set_num_threads(1)
    if directory is None:
        key, source, end = "tiny-random-llama", resolve_source("tiny-random-llama"), 3
    else:
        key, source, end = "tiny", ModelSource("directory", str(directory)), 5
    shard = load_shard(model_key=key, source=source, start=0, end=end, progress=False)
    service = NodeService(
        shard,
        node_id="head",
        gate=PlanGate(dev_open=True),
        kv_budget=2**28,
        prefill_chunk=prefill_chunk,
    )
    service.store.prefix = PrefixCache(block=BLOCK)
    return service


async def generation(
    service: NodeService, name: str, prompt: list[int], scope: str | None
) -> tuple[list[int], int]:
    """A head's generation on ``service`` alone: its tokens and where its prefill started."""
    end = service.shard.num_layers - 1
    session = service.admission.open_session(name, 0, end, prefix=scope is not None)
    usable = (len(prompt) - 1) // BLOCK * BLOCK
    hashes = block_hashes(chain_seed("tiny", scope or "", BLOCK), prompt[:usable], BLOCK)
    hit = await service.claim(session, hashes, scope)
    start = agreed([hit]) * BLOCK
    service.settle(session, start)
    tokens, ids = [], prompt[start:]
    for _ in range(STEPS):
        async with session.lock:
            choice = await service.head_forward(session, ids, GREEDY)
            session.position += len(ids)
        assert isinstance(choice, Choice)
        tokens.append(choice.token_id)
        ids = [choice.token_id]
    ran = (prompt + tokens)[: session.position]
    service.end(name, block_hashes(chain_seed("tiny", scope or "", BLOCK), ran, BLOCK))
    return tokens, start


Answer = tuple[list[int], int]


def run_all(service: NodeService, *calls: tuple[str, list[int], str | None]) -> list[Answer]:
    async def run() -> list[Answer]:
        try:
            return [await generation(service, *call) for call in calls]
        finally:
            service.close()

    return asyncio.run(run())


def test_a_second_session_of_a_shared_prompt_starts_past_the_cached_blocks() -> None:
    service = service_of()
    ((alone, _),) = run_all(service_of(), ("alone", PROMPT, None))

    first, second = run_all(service, ("a", PROMPT, "tenant"), ("b", PROMPT, "tenant"))

    assert first == (alone, 0)
    assert second == (alone, 4 * BLOCK)
    stats = service.health()["prefix_cache"]
    assert (stats["hits"], stats["reused_positions"]) == (1, 4 * BLOCK)
    assert stats["entries"] >= 1 and stats["bytes"] > 0


def test_another_scope_or_none_reuses_nothing() -> None:
    service = service_of()

    answers = run_all(
        service,
        ("a", PROMPT, "tenant-a"),
        ("b", PROMPT, "tenant-b"),
        ("c", PROMPT, None),
        ("d", PROMPT, None),
    )

    assert [start for _, start in answers] == [0, 0, 0, 0]
    assert len({tuple(tokens) for tokens, _ in answers}) == 1
    # No scope: nothing looked up and nothing kept.
    assert service.store.prefix.lookups == 2
    assert len(service.store.prefix) == 2


def test_linear_attention_states_resume_at_the_prefills_last_block_through_the_scheduler(
    checkpoints: dict[str, Path],
) -> None:
    directory = checkpoints["qwen3_next"]
    if not directory.exists():
        tiny_checkpoint("qwen3_next", directory)
    # Prefill chunks of 16: the scheduler ends one at position 32, the prompt's last block.
    ((alone, _),) = run_all(service_of(directory, prefill_chunk=16), ("alone", PROMPT, None))
    service = service_of(directory, prefill_chunk=16)

    first, second = run_all(service, ("a", PROMPT, "t"), ("b", PROMPT, "t"))

    assert first == (alone, 0)
    assert second == (alone, 4 * BLOCK)


def test_a_hit_and_a_miss_decode_together_each_as_alone() -> None:
    other = [257, *range(120, 150), 258, 10, 97, 98]  # as long as PROMPT, nothing shared
    (alone_hit, _), (alone_miss, _) = run_all(service_of(), ("p", PROMPT, None), ("o", other, None))
    service = service_of()

    async def run() -> list[Answer]:
        try:
            await generation(service, "fill", PROMPT, "t")
            batched = service.scheduler.batched_steps
            answers = await asyncio.gather(
                generation(service, "hit", PROMPT, "t"), generation(service, "miss", other, "t")
            )
            assert service.scheduler.batched_steps > batched  # they shared decode batches
            return list(answers)
        finally:
            service.close()

    assert asyncio.run(run()) == [(alone_hit, 4 * BLOCK), (alone_miss, 0)]


def test_truncating_kv_forgets_what_followed_and_continues_from_there() -> None:
    kv = state(20, fill=1.0)
    kv.truncate(12)

    keys, _ = kv.append(0, torch.full((1, 2, 1, 4), 7.0), torch.full((1, 2, 1, 4), 7.0))

    assert keys.shape[2] == 13
    assert bool((keys[0, :, :12] == 1.0).all()) and bool((keys[0, :, 12] == 7.0).all())


def test_linear_states_go_back_only_to_a_snapshot() -> None:
    kv = SessionKV()
    kv.snapshot_block = BLOCK
    for position, value in ((BLOCK, 1.0), (BLOCK + 3, 2.0)):
        kv.keep_conv_state(0, torch.full((1, 3, 4), value))
        kv.keep_recurrent_state(0, torch.full((1, 2, 4, 4), value))
        kv.ran(position, prefill=True)

    assert [kv.resumable(p) for p in (0, BLOCK, BLOCK + 1, BLOCK + 3)] == [True, True, False, True]
    with pytest.raises(ValueError):
        kv.truncate(BLOCK + 1)
    kv.truncate(BLOCK)
    state_now = kv.recurrent_state(0)
    assert state_now is not None and bool((state_now == 1.0).all())
