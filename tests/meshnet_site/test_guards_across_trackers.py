"""The durable guards hold across a flood and across tracker processes: a flood of
registrations neither evicts the replay guard nor resets the rate limits, and two trackers
over one database share every count.

Guards kept in the embedded tracker's 300-entry local-memory cache forgot both under a
flood (a replayed registration got a fresh token, the rate limit reset), and each tracker
process counted on its own. Against real trackers without REDIS_URL (the embedded
deployment): every guard is a database row.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.support.guards import client_from, wait_for_fresh_window
from tests.support.network import Network, running_tracker, start_network
from tracker_app.localnet import fresh_process_database
from tracker_app.localnet.stand_in_nodes import (
    ChallengeResponder,
    proven_registration,
    signed_registration,
)

# A model with no node: a chat request for it is counted by the rate limit, then
# answered at once with "no route" (503) instead of being served.
NODELESS = "smollm2-135m"
PROMPT = [{"role": "user", "content": "Hello"}]
FLOOD = 330
REGISTRATION_LIMIT = 10
CHAT_LIMIT = 3
# The attacked deployment: no Redis, so Django's cache was local memory.
EMBEDDED = {
    "REDIS_URL": None,
    "MESHNET_REGISTRATION_RATE_LIMIT": str(REGISTRATION_LIMIT),
    "MESHNET_RATE_LIMIT_PER_MINUTE": str(CHAT_LIMIT),
}
network = contextmanager(start_network)


def chat(client: httpx.Client, url: str, api_key: str) -> httpx.Response:
    return client.post(
        f"{url}/v1/chat/completions",
        json={"model": NODELESS, "messages": PROMPT, "max_tokens": 1},
        headers={"Authorization": f"Bearer {api_key}"},
    )


def register(client: httpx.Client, url: str, body: dict[str, Any]) -> httpx.Response:
    return client.post(f"{url}/api/nodes/register", json=body)


def error_code(response: httpx.Response) -> str:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code"}
    return str(error["code"])


def assert_rate_limited(response: httpx.Response, code: str) -> None:
    assert response.status_code == 429, response.text
    assert error_code(response) == code
    assert 1 <= int(response.headers["Retry-After"]) <= 60


@pytest.fixture
def embedded_tracker(tmp_path: Path) -> Iterator[Network]:
    with (
        fresh_process_database() as database_url,
        network(database_url, tmp_path, **EMBEDDED) as started,
    ):
        yield started


def test_a_registration_flood_neither_evicts_the_replay_guard_nor_resets_the_rate_limit(
    embedded_tracker: Network, responder: ChallengeResponder
) -> None:
    url, api_key = embedded_tracker.url, embedded_tracker.api_key
    wait_for_fresh_window()
    with client_from("127.0.0.1") as node, client_from("127.0.0.2") as flooder:
        accepted = proven_registration(responder)
        assert register(node, url, accepted).status_code == 201
        for _ in range(CHAT_LIMIT):
            assert chat(node, url, api_key).status_code != 429

        # Fresh wallets each, from one address: only the first few are even read.
        answers = [
            register(
                flooder,
                url,
                signed_registration(
                    Ed25519PrivateKey.generate(), endpoint=f"http://127.0.0.1:{20000 + index}"
                ),
            )
            for index in range(FLOOD)
        ]

        assert all(answer.status_code != 429 for answer in answers[:REGISTRATION_LIMIT])
        for answer in answers[REGISTRATION_LIMIT:]:
            assert_rate_limited(answer, "registration_rate_limited")
        with client_from("127.0.0.3") as replayer:
            replayed = register(replayer, url, accepted)
        assert replayed.status_code == 401, replayed.text
        assert error_code(replayed) == "replayed_registration"
        assert_rate_limited(chat(node, url, api_key), "rate_limit_exceeded")


def test_two_trackers_over_one_database_share_the_rate_limits(
    embedded_tracker: Network, tmp_path: Path
) -> None:
    first, api_key = embedded_tracker.url, embedded_tracker.api_key
    assert embedded_tracker.database_url is not None
    with running_tracker(
        embedded_tracker.database_url,
        tmp_path / "second",
        MESHNET_VAR_DIR=str(tmp_path / "second" / "var"),
        **EMBEDDED,
    ) as second_tracker:
        second = second_tracker.url
        wait_for_fresh_window(needed=10)
        with client_from("127.0.0.1") as client, client_from("127.0.0.4") as flooder:
            for index in range(CHAT_LIMIT):
                assert chat(client, (first, second)[index % 2], api_key).status_code != 429
            for index in range(REGISTRATION_LIMIT):
                garbage = register(flooder, (first, second)[index % 2], {"wallet": "x"})
                assert garbage.status_code == 400

            assert_rate_limited(chat(client, second, api_key), "rate_limit_exceeded")
            assert_rate_limited(chat(client, first, api_key), "rate_limit_exceeded")
            assert_rate_limited(
                register(flooder, first, signed_registration()), "registration_rate_limited"
            )
            assert_rate_limited(
                register(flooder, second, signed_registration()), "registration_rate_limited"
            )
