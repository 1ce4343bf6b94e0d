"""What the routing tests with real processes send a tracker: chats and reads of its table.

Calls by URL and key, so that one test can ask several trackers of one network.
"""

from __future__ import annotations

from typing import Any

import httpx

TINY = "tiny-random-llama"
PROMPT = [{"role": "user", "content": "Tell me about the sea."}]
# Every sample counts, and no test is slowed by the client rate limit.
SETTINGS = {
    "MESHNET_ROUTE_MIN_SAMPLE_TOKENS": "1",
    "MESHNET_RATE_LIMIT_PER_MINUTE": "1000",
    # One key sends every client's chats at once here: no per-key share in flight.
    "MESHNET_KEY_MAX_REQUESTS_IN_FLIGHT": "100000",
    "MESHNET_KEY_MAX_KV_TOKENS_IN_FLIGHT": "2000000000",
}


def routes(url: str, api_key: str) -> list[dict[str, Any]]:
    """The tiny model's rows of the tracker's ``/v1/routing``."""
    table = httpx.get(
        f"{url}/v1/routing",
        params={"model": TINY},
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=30,
    ).json()
    return list(table["models"][0]["routes"])


def chat(url: str, api_key: str) -> dict[str, Any]:
    """One 16-token chat on the tiny model; its answer, asserted 200."""
    response = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": TINY, "messages": PROMPT, "max_tokens": 16},
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return dict(response.json())
