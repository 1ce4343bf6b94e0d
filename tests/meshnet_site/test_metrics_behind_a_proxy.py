"""/metrics behind a load balancer: every client arrives from the balancer's address, so a
tracker without MESHNET_METRICS_TOKEN must not take that address as the client's.

Real trackers (daphne) behind a real forwarding proxy, set up as README's
"Scaling out" sets them (no metrics token).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.forwarding_proxy import forwarding_proxy
from tests.support.network import Tracker, running_tracker


@pytest.fixture(scope="module")
def tracker(
    process_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Tracker]:
    """A tracker with README's defaults: no metrics token, no proxy declared."""
    with running_tracker(process_database_url, tmp_path_factory.mktemp("plain")) as started:
        yield started


def test_without_a_token_a_client_through_the_balancer_gets_no_metrics(tracker: Tracker) -> None:
    with forwarding_proxy(tracker.url) as balancer:
        through = httpx.get(f"{balancer}/metrics", timeout=30)
    direct = httpx.get(f"{tracker.url}/metrics", timeout=30)

    assert through.status_code == 403, through.text[:200]
    assert through.json()["error"]["code"] == "metrics_private"
    assert "MESHNET_METRICS_TOKEN" in through.json()["error"]["message"]
    # A scraper on the tracker's own machine, straight to its port, still reads them.
    assert direct.status_code == 200 and "django_http_requests" in direct.text


def test_behind_a_declared_proxy_a_token_is_needed_even_when_it_adds_no_header(
    process_database_url: str, tmp_path: Path
) -> None:
    with (
        running_tracker(process_database_url, tmp_path, DJANGO_BEHIND_TLS_PROXY="true") as behind,
        forwarding_proxy(behind.url, add_headers=False) as balancer,
    ):
        through = httpx.get(f"{balancer}/metrics", timeout=30)
        direct = httpx.get(f"{behind.url}/metrics", timeout=30)

    assert through.status_code == 403, through.text[:200]
    assert direct.status_code == 403
    assert "behind a proxy" in through.json()["error"]["message"]
