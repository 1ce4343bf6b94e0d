"""The embedded broker: a worker polling the queue folder never takes half a message."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection

from meshnet_site import celery_broker
from meshnet_site.celery_broker import Transport


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[Any]:
    folder = str(tmp_path)
    options = {"data_folder_in": folder, "data_folder_out": folder, "control_folder": folder}
    with Connection(transport=Transport, transport_options=options) as connection:
        yield connection.channel()


def test_a_message_being_written_is_not_taken_until_it_is_whole(
    channel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen_while_writing: list[object] = []
    encode = celery_broker.dumps

    def dumps_while_a_worker_polls(payload: Any) -> str:
        # The message's file is open for writing now: what does a polling worker get?
        try:
            seen_while_writing.append(channel._get("celery"))
        except Empty:
            seen_while_writing.append(Empty)
        return str(encode(payload))

    monkeypatch.setattr(celery_broker, "dumps", dumps_while_a_worker_polls)

    channel._put("celery", {"task": "routing.prune_arms", "id": 1})

    assert seen_while_writing == [Empty]
    assert channel._get("celery") == {"task": "routing.prune_arms", "id": 1}


def test_every_message_is_taken_once_from_its_own_queue(channel: Any) -> None:
    for index in range(3):
        channel._put("celery", {"id": index})
    channel._put("other", {"id": "elsewhere"})

    assert sorted(channel._get("celery")["id"] for _ in range(3)) == [0, 1, 2]
    with pytest.raises(Empty):
        channel._get("celery")
