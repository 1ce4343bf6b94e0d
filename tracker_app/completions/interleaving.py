"""Several async streams read as one, each item as it comes: a request's choices at once.

The proxy runs each choice of a request as its own stream of pieces
(:mod:`tracker_app.completions.proxy`) and gives the client their pieces as they come;
:func:`interleaved` is that merge, with the cancellation a client's
disconnect needs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import TypeVar, cast

_T = TypeVar("_T")


def interleaved(streams: Sequence[AsyncGenerator[_T, None]]) -> AsyncGenerator[_T, None]:
    """The items of every stream as each comes, the streams running at once.

    The first stream to raise ends it all with its exception; the others are
    cancelled (closing their heads' streams), as they are when this iterator
    is closed or cancelled. One stream is that stream itself (no layer an item
    passes through). The caller closes what it gets (``aclosing``).
    """
    if len(streams) == 1:
        return streams[0]
    return _merged(streams)


async def _merged(streams: Sequence[AsyncGenerator[_T, None]]) -> AsyncGenerator[_T, None]:
    queue: asyncio.Queue[tuple[_T | None, BaseException | None, bool]] = asyncio.Queue()

    async def pump(stream: AsyncGenerator[_T, None]) -> None:
        try:
            async for produced in stream:
                queue.put_nowait((produced, None, False))
        except Exception as error:  # handed to the reader; a cancellation is not
            queue.put_nowait((None, error, True))
        else:
            queue.put_nowait((None, None, True))

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            got, error, ended = await queue.get()
            if error is not None:
                raise error
            if ended:
                running -= 1
            else:
                yield cast(_T, got)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
