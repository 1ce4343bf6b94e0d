"""A link's inbox: the socket keeps reading while the unread frames stay within the bound."""

from __future__ import annotations

import asyncio

from nodes_app.runtime.hop.link_inbox import Inbox


class Socket(asyncio.Transport):
    """A transport that only records whether it is reading."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True
        self.switches = 0

    def is_reading(self) -> bool:
        return self.reading

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.switches += self.reading
        self.reading = False

    def resume_reading(self) -> None:
        self.switches += not self.reading
        self.reading = True


def frame(size: int) -> dict[str, object]:
    return {"type": "websocket.receive", "bytes": bytes(size)}


def test_a_strangers_link_reads_one_frame_at_a_time() -> None:
    socket = Socket()
    inbox = Inbox(socket)

    inbox.put_nowait(frame(10))
    assert not socket.reading
    assert inbox.take() == frame(10)
    assert socket.reading
    assert inbox.take() is None


def test_a_trusted_link_keeps_reading_until_its_unread_frames_pass_the_bound() -> None:
    socket = Socket()
    inbox = Inbox(socket)
    inbox.read_ahead = 100

    for _ in range(10):
        inbox.put_nowait(frame(10))
        inbox.take()
    assert socket.reading and socket.switches == 0

    for _ in range(11):
        inbox.put_nowait(frame(10))
    assert not socket.reading  # 110 bytes unread
    inbox.take()
    assert socket.reading


def test_a_frame_over_the_bound_pauses_reading_at_once() -> None:
    socket = Socket()
    inbox = Inbox(socket)
    inbox.read_ahead = 100

    inbox.put_nowait(frame(101))
    assert not socket.reading


def test_a_waiting_reader_wakes_on_a_frame_or_its_timeout() -> None:
    async def scenario() -> tuple[bool, bool]:
        inbox = Inbox(Socket())
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, inbox.put_nowait, frame(1))
        await asyncio.wait_for(inbox.wait(10.0), 5.0)
        woke_on_frame = inbox.take() is not None
        await asyncio.wait_for(inbox.wait(0.01), 5.0)
        return woke_on_frame, inbox.take() is None

    assert asyncio.run(scenario()) == (True, True)


def test_a_pumped_inbox_receives_in_order_one_message_ahead() -> None:
    async def scenario() -> list[object]:
        messages: list[dict[str, object]] = [frame(1), frame(2), {"type": "websocket.disconnect"}]
        received = iter(messages)
        calls = 0

        async def receive() -> dict[str, object]:
            nonlocal calls
            calls += 1
            return next(received)

        inbox = Inbox.pumping(receive)
        taken: list[object] = []
        while len(taken) < len(messages):
            await inbox.wait(1.0)
            assert calls <= len(taken) + 1
            message = inbox.take()
            if message is not None:
                taken.append(message)
        return taken

    assert asyncio.run(scenario()) == [frame(1), frame(2), {"type": "websocket.disconnect"}]


def test_a_pumped_inbox_whose_receive_fails_ends_the_link() -> None:
    async def scenario() -> object:
        async def receive() -> dict[str, object]:
            raise RuntimeError("the connection is gone")

        inbox = Inbox.pumping(receive)
        await asyncio.wait_for(inbox.wait(5.0), 5.0)
        return inbox.take()

    assert asyncio.run(scenario()) == {"type": "websocket.disconnect", "code": 1006}
