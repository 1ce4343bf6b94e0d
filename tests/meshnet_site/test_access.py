"""Who may reach what on a live tracker: a host outside ALLOWED_HOSTS is refused on HTTP and
on the websocket, metrics need their token when one is set, and the routing table needs an
API key and shows node endpoints to staff only. Against a real tracker (daphne) and node.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.network import Network, start_network
from tracker_app.localnet import fresh_process_database

TINY = "tiny-random-llama"
METRICS_TOKEN = "metrics-token-for-the-access-tests"
STAFF, PASSWORD = "access-staff", "a long password for tests"
ONE_WORD = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """Tracker with a metrics token, one whole-model tiny node, a staff user."""
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("access")
        for network in start_network(
            database_url,
            tmp,
            MESHNET_RATE_LIMIT_PER_MINUTE="1000",
            MESHNET_METRICS_TOKEN=METRICS_TOKEN,
        ):
            network.add_node("honest", TINY, (0, 3), wait=False)
            network.create_staff_user(STAFF, PASSWORD)
            network.wait_for_nodes()
            network.wait_for_route(TINY)
            yield network


def routing(network: Network, **headers: str) -> httpx.Response:
    return httpx.get(f"{network.url}/v1/routing", params={"model": TINY}, headers=headers)


@contextlib.contextmanager
def staff_session(network: Network) -> Iterator[httpx.Client]:
    """A client signed in through the dashboard's real sign-in form."""
    with httpx.Client(base_url=network.url, timeout=30) as client:
        client.get("/dashboard/login/")
        csrf = client.cookies["csrftoken"]
        response = client.post(
            "/dashboard/login/",
            data={"username": STAFF, "password": PASSWORD, "csrfmiddlewaretoken": csrf},
        )
        assert response.status_code == 302 and "sessionid" in client.cookies, response.text
        yield client


def test_the_routing_table_is_refused_anonymously_and_shows_endpoints_to_staff_only(
    network: Network,
) -> None:
    honest = network.nodes["honest"].endpoint
    anonymous = routing(network)
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "invalid_api_key"
    assert "127.0.0.1" not in anonymous.text

    client = routing(network, Authorization=f"Bearer {network.api_key}")
    assert client.status_code == 200
    assert client.json()["models"][0]["routes"]
    assert "endpoint" not in client.text and honest not in client.text

    with staff_session(network) as staff:
        table = staff.get("/v1/routing", params={"model": TINY}).json()
    endpoints = {hop["endpoint"] for r in table["models"][0]["routes"] for hop in r["hops"]}
    assert honest in endpoints


def test_metrics_need_the_token_when_one_is_set(network: Network) -> None:
    url = f"{network.url}/metrics"

    refused = httpx.get(url)
    wrong = httpx.get(url, headers={"Authorization": "Bearer not-the-metrics-token"})
    served = httpx.get(url, headers={"Authorization": f"Bearer {METRICS_TOKEN}"})

    assert (refused.status_code, wrong.status_code) == (401, 401)
    assert refused.json()["error"]["code"] == "invalid_metrics_token"
    assert "django_http_requests" not in refused.text
    assert served.status_code == 200 and "django_http_requests" in served.text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/healthz"])
def test_a_host_outside_allowed_hosts_is_refused_on_http(network: Network, path: str) -> None:
    headers = {**network.headers(), "Host": "evil.example"}
    body: dict[str, Any] = {"model": TINY, "messages": ONE_WORD, "max_tokens": 4}

    if path == "/v1/chat/completions":
        response = httpx.post(f"{network.url}{path}", json=body, headers=headers, timeout=30)
    else:
        response = httpx.get(f"{network.url}{path}", headers=headers, timeout=30)

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "disallowed_host"


def test_a_host_outside_allowed_hosts_is_refused_on_the_websocket(network: Network) -> None:
    with staff_session(network) as staff:
        cookie = f"sessionid={staff.cookies['sessionid']}"
    own_host = urlsplit(network.url).netloc

    assert websocket_status(network, host=own_host, cookie=cookie) == 101  # the control
    assert websocket_status(network, host="evil.example", cookie=cookie) == 403


def websocket_status(network: Network, *, host: str, cookie: str) -> int:
    """The status line's code of a websocket handshake to ``/ws/dashboard/`` with ``host``.

    The Origin is always the tracker's own, so only the Host can be what is refused.
    """
    address = urlsplit(network.url)
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        "GET /ws/dashboard/ HTTP/1.1\r\n"
        f"Host: {host}\r\nOrigin: {network.url}\r\nCookie: {cookie}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    with socket.create_connection((address.hostname, address.port), timeout=10) as conn:
        conn.sendall(request.encode())
        status_line = conn.recv(4096).split(b"\r\n", 1)[0].decode()
    match = re.match(r"HTTP/1\.1 (\d{3})", status_line)
    assert match, status_line
    return int(match.group(1))
