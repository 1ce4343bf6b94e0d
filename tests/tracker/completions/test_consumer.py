"""The completion endpoints' consumers, driven in process through the ASGI application:
what a client is answered before its request is routed (the method, the key, the body,
the model), each endpoint in its own clients' error shape. (Requests served end to end:
``test_chat_endpoint``, ``test_messages_api``, ``test_responses_api``.)"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import HttpCommunicator
from django.db import connections
from django.test import override_settings
from rest_framework import status

from meshnet_site.asgi import application
from tracker_app.api_keys.services import api_key_create

pytestmark = pytest.mark.django_db(transaction=True)

HOST = (b"host", b"127.0.0.1")
CHAT = {"model": "nobody-serves-this", "messages": [{"role": "user", "content": "hi"}]}


def answer(
    path: str,
    body: dict[str, Any] | None = None,
    *,
    method: str = "POST",
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> tuple[int, dict[str, Any]]:
    """The status and JSON body ``path`` answers."""

    async def scenario() -> tuple[int, dict[str, Any]]:
        communicator = HttpCommunicator(
            application,
            method,
            path,
            body=json.dumps(body or {}).encode(),
            headers=[(b"content-type", b"application/json"), HOST, *headers],
        )
        try:
            response = await communicator.get_response(timeout=10)
        finally:
            await communicator.send_input({"type": "http.disconnect"})
            await communicator.wait(timeout=5)
            # The consumer's database thread outlives the request: close its connection.
            await database_sync_to_async(connections.close_all)()
        return response["status"], json.loads(response["body"])

    return asyncio.run(scenario())


def bearer() -> tuple[bytes, bytes]:
    return (b"authorization", f"Bearer {api_key_create(name='consumer').plain}".encode())


def test_a_completion_endpoint_takes_only_post() -> None:
    code, body = answer("/v1/chat/completions", method="GET")

    assert code == status.HTTP_405_METHOD_NOT_ALLOWED
    assert body["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
def test_a_request_without_a_key_is_a_401_in_openais_shape(path: str) -> None:
    code, body = answer(path, CHAT)

    assert code == status.HTTP_401_UNAUTHORIZED
    assert body["error"]["code"] == "invalid_api_key"
    assert "Authorization: Bearer" in body["error"]["message"]


def test_the_messages_api_answers_its_errors_in_anthropics_shape() -> None:
    code, body = answer("/v1/messages", {"model": "m", "max_tokens": 8, "messages": []})

    assert code == status.HTTP_401_UNAUTHORIZED
    assert (body["type"], body["error"]["type"]) == ("error", "authentication_error")


def test_a_key_in_x_api_key_opens_the_messages_api() -> None:
    key = api_key_create(name="anthropic-client").plain
    request = {"model": "nobody-serves-this", "max_tokens": 8, "messages": CHAT["messages"]}

    code, body = answer("/v1/messages", request, headers=((b"x-api-key", key.encode()),))

    assert code == status.HTTP_404_NOT_FOUND  # past the key: the model is the first refusal
    assert body["type"] == "error"


def test_with_a_good_key_an_unknown_model_is_a_404_naming_it() -> None:
    code, body = answer("/v1/chat/completions", CHAT, headers=(bearer(),))

    assert code == status.HTTP_404_NOT_FOUND
    assert body["error"]["code"] == "model_not_found"
    assert "nobody-serves-this" in body["error"]["message"]


def test_with_a_good_key_a_bad_body_is_a_400_naming_the_field() -> None:
    code, body = answer("/v1/chat/completions", {**CHAT, "temperature": 9}, headers=(bearer(),))

    assert code == status.HTTP_400_BAD_REQUEST
    assert body["error"]["param"] == "temperature"


@override_settings(MESHNET_MAX_REQUEST_BYTES=64)
def test_a_body_past_the_cap_is_a_413_whatever_its_key() -> None:
    code, body = answer("/v1/chat/completions", {**CHAT, "padding": "x" * 200})

    assert code == status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    assert "64 bytes" in body["error"]["message"]
