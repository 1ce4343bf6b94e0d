"""A request's choices read as one stream: each item as it comes, the first failure ends
them all, and closing it stops every choice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from tracker_app.completions.interleaving import interleaved


async def read_all(stream: AsyncGenerator[str, None]) -> list[str]:
    return [item async for item in stream]


def test_the_items_of_every_stream_come_as_each_is_produced() -> None:
    async def scenario() -> list[str]:
        # Each stream produces its next item only once the other produced one.
        a_turn, b_turn = asyncio.Event(), asyncio.Event()

        async def a() -> AsyncGenerator[str, None]:
            yield "a0"
            b_turn.set()
            await a_turn.wait()
            a_turn.clear()
            yield "a1"
            b_turn.set()

        async def b() -> AsyncGenerator[str, None]:
            await b_turn.wait()
            b_turn.clear()
            yield "b0"
            a_turn.set()
            await b_turn.wait()
            yield "b1"

        return await read_all(interleaved([a(), b()]))

    items = asyncio.run(asyncio.wait_for(scenario(), timeout=5))

    assert items == ["a0", "b0", "a1", "b1"]


def test_one_stream_is_read_as_itself() -> None:
    async def only() -> AsyncGenerator[str, None]:
        yield "a0"

    stream = only()

    assert interleaved([stream]) is stream
    asyncio.run(stream.aclose())


def test_the_first_stream_to_fail_ends_them_all_with_its_error() -> None:
    stopped: list[str] = []

    async def long(name: str) -> AsyncGenerator[str, None]:
        try:
            yield f"{name}0"
            await asyncio.sleep(10)
            yield f"{name}1"
        finally:
            stopped.append(name)

    async def failing() -> AsyncGenerator[str, None]:
        await asyncio.sleep(0.01)
        yield "f0"
        raise RuntimeError("the head died")

    async def scenario() -> list[str]:
        seen: list[str] = []
        with pytest.raises(RuntimeError, match="the head died"):
            async for item in interleaved([long("a"), failing(), long("b")]):
                seen.append(item)
        return seen

    seen = asyncio.run(asyncio.wait_for(scenario(), timeout=5))

    assert sorted(seen) == ["a0", "b0", "f0"]
    assert sorted(stopped) == ["a", "b"]


def test_closing_the_stream_stops_every_choice() -> None:
    stopped: list[str] = []

    async def endless(name: str) -> AsyncGenerator[str, None]:
        try:
            while True:
                yield name
                await asyncio.sleep(0.01)
        finally:
            stopped.append(name)

    async def scenario() -> None:
        merged = interleaved([endless("a"), endless("b")])
        await anext(merged)
        await merged.aclose()

    asyncio.run(asyncio.wait_for(scenario(), timeout=5))

    assert sorted(stopped) == ["a", "b"]
