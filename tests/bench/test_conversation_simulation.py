"""The routing simulator's conversations (bench/routing_simulation/conversations.py)."""

from __future__ import annotations

from bench.routing_simulation.conversations import (
    SYSTEM_TOKENS,
    Conversation,
    NodeCache,
    cold_work,
    converse,
    thompson,
)
from bench.routing_simulation.topologies import REPLICA_SCENARIOS, Network
from nodes_app.protocol.limits import PREFIX_BLOCK_TOKENS

TWO_STAGES = REPLICA_SCENARIOS[0]


def talk(index: int, app: int) -> Conversation:
    return Conversation(index, app, [40, 50], [100, 60], [1.0, 1.0], [1.0, 1.0])


def test_a_turn_starts_with_the_previous_turns_prompt_and_answer() -> None:
    chat = talk(0, 2)
    chat.say(chat.users[0])
    chat.say(chat.answers[0])
    kept = chat.chain(len(chat.tokens) - 1)
    chat.say(chat.users[1])

    assert chat.chain(len(chat.tokens))[: len(kept)] == kept


def test_an_apps_conversations_share_its_system_prompts_blocks_only() -> None:
    chats = [talk(0, 2), talk(1, 2), talk(2, 3)]
    for chat in chats:
        chat.say(chat.users[0])
    first, same_app, other_app = (chat.chain(len(chat.tokens)) for chat in chats)
    system = SYSTEM_TOKENS // PREFIX_BLOCK_TOKENS  # full blocks of the system prompt alone

    assert first[:system] == same_app[:system]
    assert first[system] != same_app[system]
    assert first[0] != other_app[0]


def test_a_full_cache_evicts_a_chains_last_blocks_before_its_first() -> None:
    cache = NodeCache(capacity=4)
    cache.keep(["a1", "a2", "a3"])
    cache.keep(["b1", "b2"])

    assert cache.leading(["a1", "a2", "a3"], 3) == 2
    assert cache.leading(["b1", "b2"], 2) == 2
    assert len(cache) == 4


def test_cache_aware_routing_holds_more_of_the_prompts_than_cache_blind() -> None:
    rate = 0.9 * Network(TWO_STAGES).capacity_bound() / cold_work()
    for seed in (1, 2, 3):
        aware = converse(TWO_STAGES, thompson(cache_aware=True), seed, 30, rate)
        blind = converse(TWO_STAGES, thompson(cache_aware=False), seed, 30, rate)

        assert aware.hit_rate > blind.hit_rate
        assert len(aware.ttft) == len(blind.ttft)
