"""The dashboard's websocket and the dashboard's chat, against the real ASGI application.

In process: ``WebsocketCommunicator`` / ``HttpCommunicator`` drive
``meshnet_site.asgi.application`` (auth middleware, origin check, routing)
with the in-memory channel layer. The proxy's events are emitted through the
console exactly as the chat proxy emits them.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from channels.db import database_sync_to_async
from channels.testing import HttpCommunicator, WebsocketCommunicator
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.db import connections
from django.test import Client
from django.utils import timezone

from meshnet_site import events
from meshnet_site.asgi import application
from nodes_app.events import epoch_announce, nodes_announce
from nodes_app.models import Node, NodeStatus
from nodes_app.services import node_deregister, node_heartbeat
from tests.support.dashboard import TINY, make_node, staff_user, tiny_model
from tests.support.endpoint_gate import isolated_gate
from tracker_app.api_keys.dashboard_session import KEY_NAME_PREFIX
from tracker_app.completions import console
from tracker_app.dashboard import live as dashboard_live
from tracker_app.models import ApiKey

T = TypeVar("T")
# The origin validator read ALLOWED_HOSTS at import, before the test runner added testserver.
ORIGIN = (b"origin", b"http://127.0.0.1")
HOST = (b"host", b"127.0.0.1")


@pytest.fixture(autouse=True)
def _fresh_live_state(monkeypatch: pytest.MonkeyPatch) -> None:
    # Throttles and series are per process; each test starts from quiet ones.
    monkeypatch.setattr(console, "route_series", console.RouteSeries())
    monkeypatch.setattr(
        dashboard_live, "routing_pushes", dashboard_live.Throttle(dashboard_live._push_routing)
    )
    monkeypatch.setattr(
        dashboard_live, "billing_pushes", dashboard_live.Throttle(dashboard_live._push_billing)
    )


def session_cookie(*, is_staff: bool = True) -> str:
    client = Client()
    client.force_login(staff_user(f"user-{uuid.uuid4().hex[:6]}", is_staff=is_staff))
    return f"sessionid={client.cookies['sessionid'].value}"


def dashboard_socket(cookie: str | None) -> WebsocketCommunicator:
    headers = [ORIGIN, HOST]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, "/ws/dashboard/", headers=headers)


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    async def then_close() -> T:
        try:
            return await scenario()
        finally:
            # The consumer's database thread outlives the test; with persistent
            # connections (PostgreSQL) it would keep the test database open.
            await database_sync_to_async(connections.close_all)()

    return asyncio.run(then_close())


async def receive_until(
    socket: WebsocketCommunicator, wanted: Callable[[dict[str, Any]], bool], timeout: float = 5
) -> list[dict[str, Any]]:
    """Every message up to and including the first ``wanted`` one."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while not seen or not wanted(seen[-1]):
        left = deadline - time.monotonic()
        assert left > 0, f"no wanted message; got {[m['type'] for m in seen]}"
        seen.append(await socket.receive_json_from(timeout=left))
    return seen


async def drain(socket: WebsocketCommunicator, seconds: float) -> list[dict[str, Any]]:
    """Every message that arrives within ``seconds``."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        # receive_nothing waits without ending the application (a timed-out
        # receive_json_from would cancel it).
        if not await socket.receive_nothing(timeout=0.05):
            seen.append(await socket.receive_json_from(timeout=1))
    return seen


# --- who may connect ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_anonymous_socket_is_refused() -> None:
    async def scenario() -> bool:
        socket = dashboard_socket(None)
        connected, _ = await socket.connect()
        await socket.disconnect()
        return connected

    assert run(scenario) is False


@pytest.mark.django_db(transaction=True)
def test_a_socket_of_a_user_who_is_not_staff_is_refused() -> None:
    cookie = session_cookie(is_staff=False)

    async def scenario() -> bool:
        socket = dashboard_socket(cookie)
        connected, _ = await socket.connect()
        await socket.disconnect()
        return connected

    assert run(scenario) is False


@pytest.mark.django_db(transaction=True)
def test_a_socket_from_another_site_is_refused() -> None:
    cookie = session_cookie()

    async def scenario() -> bool:
        socket = WebsocketCommunicator(
            application,
            "/ws/dashboard/",
            headers=[(b"origin", b"http://evil.example"), (b"cookie", cookie.encode())],
        )
        connected, _ = await socket.connect()
        await socket.disconnect()
        return connected

    assert run(scenario) is False


# --- what it sends --------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_staff_get_a_snapshot_on_connect_and_again_on_request() -> None:
    make_node("head", 0, 3)
    cookie = session_cookie()

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        socket = dashboard_socket(cookie)
        connected, _ = await socket.connect()
        assert connected
        try:
            first = await socket.receive_json_from(timeout=5)
            await socket.send_json_to({"type": "resync"})
            again = await socket.receive_json_from(timeout=5)
        finally:
            await socket.disconnect()
        return first, again

    first, again = run(scenario)

    assert first["type"] == again["type"] == "snapshot"
    [tiny] = [m for m in first["models"] if m["key"] == TINY]
    assert [n["id"] for n in tiny["nodes"]] == ["head"]
    assert [m["model"] for m in first["routing"]["models"]] == sorted(
        m["key"] for m in first["models"]
    )
    assert set(first["calls"]) == {"in_flight", "recent"}
    assert "api_keys" in first["billing"]


@pytest.mark.django_db(transaction=True)
def test_each_proxy_event_arrives_as_the_requests_call_summary() -> None:
    cookie = session_cookie()
    request_id = str(uuid.uuid4())

    async def scenario() -> list[dict[str, Any]]:
        socket = dashboard_socket(cookie)
        await socket.connect()
        try:
            await socket.receive_json_from(timeout=5)  # the snapshot
            await console.console_emit(
                console.ROUTE_SELECTED,
                request_id,
                model=TINY,
                mode="scout",
                signature=f"{TINY} | head[0-3]",
            )
            await console.console_emit(console.CONNECTED, request_id, endpoint="http://head")
            await console.console_emit(
                console.PROGRESS, request_id, tokens=7, tokens_per_second=21.5, queue=0
            )
            return [await socket.receive_json_from(timeout=5) for _ in range(3)]
        finally:
            await socket.disconnect()

    messages = run(scenario)

    assert [m["type"] for m in messages] == ["call", "call", "call"]
    assert [m["event"]["kind"] for m in messages] == [
        console.ROUTE_SELECTED,
        console.CONNECTED,
        console.PROGRESS,
    ]
    call = messages[-1]["call"]
    assert call["request_id"] == request_id
    assert (call["state"], call["mode"], call["route"]) == (
        "processing",
        "scout",
        f"{TINY} | head[0-3]",
    )
    assert (call["tokens"], call["tokens_per_second"]) == (7, 21.5)


@pytest.mark.django_db(transaction=True)
def test_a_node_that_changes_is_pushed_as_its_row() -> None:
    node = make_node("tail", 2, 3)
    cookie = session_cookie()

    async def scenario() -> list[dict[str, Any]]:
        socket = dashboard_socket(cookie)
        await socket.connect()
        try:
            await socket.receive_json_from(timeout=5)
            await database_sync_to_async(_go_offline)(node.pk)
            return await receive_until(socket, lambda m: m["type"] == "node")
        finally:
            await socket.disconnect()

    messages = run(scenario)

    row = messages[-1]["node"]
    assert (row["id"], row["status"], row["shard_start"], row["model"]) == (
        "tail",
        "offline",
        2,
        TINY,
    )


@pytest.mark.django_db(transaction=True)
def test_a_node_leaving_the_registry_is_pushed_with_the_epoch_it_bumped() -> None:
    node = make_node("leaver", 0, 3)
    cookie = session_cookie()

    async def scenario() -> list[dict[str, Any]]:
        socket = dashboard_socket(cookie)
        await socket.connect()
        try:
            await socket.receive_json_from(timeout=5)
            await database_sync_to_async(node_deregister)(node=node)
            return await receive_until(socket, lambda m: m["type"] == "routing")
        finally:
            await socket.disconnect()

    messages = run(scenario)

    by_type = {m["type"]: m for m in messages}
    assert by_type["node"]["node"]["status"] == "offline"
    assert (by_type["epoch"]["model"], by_type["epoch"]["reason"]) == (TINY, "leave: leaver")
    assert by_type["routing"]["model"]["routes"] == []


@pytest.mark.django_db(transaction=True)
def test_heartbeats_that_change_nothing_visible_are_pushed_at_most_every_few_seconds() -> None:
    node = make_node("beating", 0, 3)
    cookie = session_cookie()

    def heartbeat(sessions: int, cache_load: float, hits: int) -> None:
        node_heartbeat(
            node=Node.objects.select_related("model").get(pk=node.pk),
            active_sessions=sessions,
            queue_depth=0,
            measured_tps=50.0,
            prefix_cache_load=cache_load,
            prefix_hits=hits,
            now=timezone.now(),
            gate=isolated_gate(),
        )

    async def scenario() -> list[dict[str, Any]]:
        socket = dashboard_socket(cookie)
        await socket.connect()
        try:
            await socket.receive_json_from(timeout=5)
            # A hit alone waits for the next announcement; a new cache load does not.
            beats = [(0, 0.0, 0), (0, 0.0, 0), (0, 0.0, 1), (0, 0.25, 1), (2, 0.25, 1)]
            for beat in beats:
                await database_sync_to_async(heartbeat)(*beat)
            return await drain(socket, 0.5)
        finally:
            await socket.disconnect()

    messages = run(scenario)

    rows = [m["node"] for m in messages if m["type"] == "node"]
    seen = [(r["active_sessions"], r["prefix_cache_load"], r["prefix_hits"]) for r in rows]
    assert seen == [(0, 0.0, 0), (0, 0.25, 1), (2, 0.25, 1)]


@pytest.mark.django_db(transaction=True)
def test_an_update_another_tracker_publishes_reaches_this_trackers_dashboards(
    redis_url: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"meshnet-test-{uuid.uuid4().hex[:8]}"  # CI's Redis is shared
    config = {"hosts": [redis_url], "prefix": prefix}
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer", "CONFIG": config}
    }
    tiny_model()
    cookie = session_cookie()

    async def scenario() -> list[dict[str, Any]]:
        socket = dashboard_socket(cookie)
        await socket.connect()
        try:
            await socket.receive_json_from(timeout=5)
            # What another tracker process does: the same bus, over its own connection.
            other_tracker = RedisPubSubChannelLayer(**config)
            monkeypatch.setattr(events, "get_channel_layer", lambda: other_tracker)
            await events.publish_async("epoch", {"model": TINY, "epoch": 9, "reason": "elsewhere"})
            return await receive_until(socket, lambda m: m["type"] == "epoch")
        finally:
            await socket.disconnect()

    messages = run(scenario)

    assert messages[-1] == {"type": "epoch", "model": TINY, "epoch": 9, "reason": "elsewhere"}


def _go_offline(node_id: str) -> None:
    Node.objects.filter(pk=node_id).update(status=NodeStatus.OFFLINE)
    nodes_announce([node_id])


@pytest.mark.django_db(transaction=True)
def test_an_epoch_bump_is_pushed_and_followed_by_the_models_routing_table() -> None:
    make_node("solo", 0, 3)
    cookie = session_cookie()

    async def scenario() -> list[dict[str, Any]]:
        socket = dashboard_socket(cookie)
        await socket.connect()
        try:
            await socket.receive_json_from(timeout=5)
            await database_sync_to_async(epoch_announce)(
                model_key=TINY, epoch=7, reason="join: solo"
            )
            return await receive_until(socket, lambda m: m["type"] == "routing")
        finally:
            await socket.disconnect()

    messages = run(scenario)

    assert [m["type"] for m in messages] == ["epoch", "routing"]
    assert messages[0] == {"type": "epoch", "model": TINY, "epoch": 7, "reason": "join: solo"}
    table = messages[1]["model"]
    assert table["model"] == TINY
    assert [r["signature"] for r in table["routes"]] == [f"{TINY} | solo[0-3]"]


@pytest.mark.django_db(transaction=True)
def test_a_completion_pushes_the_models_routing_table_with_the_new_speed() -> None:
    make_node("solo", 0, 3)
    cookie = session_cookie()
    signature = f"{TINY} | solo[0-3]"

    async def scenario() -> list[dict[str, Any]]:
        socket = dashboard_socket(cookie)
        await socket.connect()
        try:
            await socket.receive_json_from(timeout=5)
            await _complete(str(uuid.uuid4()), signature, tokens=24, tps=48.0)
            return await receive_until(socket, lambda m: m["type"] == "routing")
        finally:
            await socket.disconnect()

    messages = run(scenario)

    finished = [m["call"] for m in messages if m["type"] == "call"][-1]
    assert (finished["state"], finished["tokens"]) == ("completed", 24)
    table = messages[-1]["model"]
    assert table["model"] == TINY
    assert [tps for _, tps in table["series"][signature]] == [48.0]


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_completions_sends_few_routing_tables_and_the_last_is_current() -> None:
    make_node("solo", 0, 3)
    cookie = session_cookie()
    signature = f"{TINY} | solo[0-3]"

    async def scenario() -> list[dict[str, Any]]:
        socket = dashboard_socket(cookie)
        await socket.connect()
        try:
            await socket.receive_json_from(timeout=5)
            for n in range(30):
                await _complete(str(uuid.uuid4()), signature, tokens=20, tps=float(10 + n))
            return await drain(socket, 2 * dashboard_live.PUSH_INTERVAL_SECONDS + 1.0)
        finally:
            await socket.disconnect()

    messages = run(scenario)

    tables = [m["model"] for m in messages if m["type"] == "routing"]
    assert 1 <= len(tables) <= 3
    assert [tps for _, tps in tables[-1]["series"][signature]] == [float(10 + n) for n in range(30)]


async def _complete(request_id: str, signature: str, *, tokens: int, tps: float) -> None:
    await console.console_emit(
        console.ROUTE_SELECTED, request_id, model=TINY, mode="exploit", signature=signature
    )
    await console.console_emit(
        console.COMPLETE,
        request_id,
        signature=signature,
        completion_tokens=tokens,
        tokens_per_second=tps,
        finish_reason="length",
    )


# --- the dashboard's chat -------------------------------------------------------


def dashboard_page_session(username: str = "staff") -> tuple[str, str]:
    """The cookies and CSRF token a staff member's browser holds on the dashboard."""
    client = Client()
    client.force_login(staff_user(username))
    page = client.get("/dashboard/").content.decode()
    token = page.split('name="csrf-token" content="', 1)[1].split('"', 1)[0]
    cookies = "; ".join(f"{name}={morsel.value}" for name, morsel in client.cookies.items())
    return cookies, token


def post_chat(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """POST a streamed chat for the tiny model (which no node serves here)."""
    tiny_model()
    body = json.dumps(
        {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    ).encode()

    async def scenario() -> dict[str, Any]:
        communicator = HttpCommunicator(
            application,
            "POST",
            "/v1/chat/completions",
            body=body,
            headers=[(b"content-type", b"application/json"), HOST, *headers],
        )
        try:
            response = await communicator.get_response(timeout=10)
        finally:
            await communicator.send_input({"type": "http.disconnect"})
            await communicator.wait(timeout=5)
        return {"status": response["status"], **json.loads(response["body"])}

    return run(scenario)


@pytest.mark.django_db(transaction=True)
def test_the_dashboard_chats_as_the_staff_user_with_a_key_of_their_own() -> None:
    cookies, token = dashboard_page_session("operator")

    # No node serves the model: the request got past authentication to routing.
    answer = post_chat([(b"cookie", cookies.encode()), (b"x-csrftoken", token.encode()), ORIGIN])

    assert (answer["status"], answer["error"]["code"]) == (503, "no_route")
    assert ApiKey.objects.filter(name=f"{KEY_NAME_PREFIX}operator", revoked=False).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_dashboard_chat_without_the_pages_csrf_token_is_refused() -> None:
    cookies, _ = dashboard_page_session()

    answer = post_chat([(b"cookie", cookies.encode()), ORIGIN])

    assert (answer["status"], answer["error"]["code"]) == (403, "csrf_failed")


@pytest.mark.django_db(transaction=True)
def test_a_page_on_another_site_cannot_chat_with_a_staff_session() -> None:
    cookies, token = dashboard_page_session()

    answer = post_chat(
        [
            (b"cookie", cookies.encode()),
            (b"x-csrftoken", token.encode()),
            (b"origin", b"http://evil.example"),
        ]
    )

    assert (answer["status"], answer["error"]["code"]) == (403, "csrf_failed")


@pytest.mark.django_db(transaction=True)
def test_without_a_session_or_a_key_the_chat_asks_for_a_key() -> None:
    answer = post_chat([ORIGIN])

    assert (answer["status"], answer["error"]["code"]) == (401, "invalid_api_key")


@pytest.mark.django_db(transaction=True)
def test_revoking_a_users_dashboard_key_stops_their_dashboard_chat() -> None:
    cookies, token = dashboard_page_session("operator")
    headers = [(b"cookie", cookies.encode()), (b"x-csrftoken", token.encode()), ORIGIN]
    post_chat(headers)
    ApiKey.objects.filter(name=f"{KEY_NAME_PREFIX}operator").update(revoked=True)

    answer = post_chat(headers)

    assert (answer["status"], answer["error"]["code"]) == (403, "dashboard_key_revoked")
