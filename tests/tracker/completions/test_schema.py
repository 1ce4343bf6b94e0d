"""The schema tells the truth about every endpoint.

Real answers of a real tracker (runtracker, PostgreSQL, a tiny-model node
serving a whole route) are checked against the schema that tracker serves:
a documented status, a documented content type, a body matching its
documented schema (schemathesis' checks). The chat is checked whole and
streamed, event by event; the registry with a real wallet's signature and an
endpoint that proves it; the refusals with the error body they document.
``test_schema_fuzz.py`` lets schemathesis generate the requests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command
from schemathesis.core.failures import FailureGroup

from bench.schema_checks import assert_conforms, live_schema
from nodes_app.protocol.sse import SSE_DONE, sse_data
from tests.support.network import Network, start_network
from tests.support.nodes import TINY
from tracker_app.localnet import fresh_process_database
from tracker_app.localnet.stand_in_nodes import (
    ChallengeResponder,
    proven_registration,
    signed_registration,
)

PROMPT = [{"role": "user", "content": "Tell me about meshes."}]
STAFF_PASSWORD = "pw-schema"


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """A tracker with one tiny-model node serving the whole model, an API key and staff."""
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("schema")
        for network in start_network(database_url, tmp, MESHNET_RATE_LIMIT_PER_MINUTE="1000"):
            network.add_node("whole", TINY, (0, 3), wait=False)
            network.create_staff_user("staff", STAFF_PASSWORD)
            network.wait_for_route(TINY)
            yield network


@pytest.fixture(scope="module")
def schema(network: Network) -> Any:
    return live_schema(network.url)


@contextlib.contextmanager
def staff_client(network: Network) -> Iterator[httpx.Client]:
    """A client signed in as staff through the admin's login form."""
    with httpx.Client(base_url=network.url, timeout=30) as client:
        page = client.get("/admin/login/")
        token = page.text.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
        client.post(
            "/admin/login/?next=/admin/",
            data={"username": "staff", "password": STAFF_PASSWORD, "csrfmiddlewaretoken": token},
        )
        assert "sessionid" in client.cookies
        yield client


def test_the_schema_generates_without_a_warning(tmp_path: Path) -> None:
    """No colliding component names, no authenticator the schema cannot describe."""
    call_command("spectacular", "--fail-on-warn", "--validate", "--file", tmp_path / "s.yaml")


def test_a_whole_chat_answer_matches_the_schema(network: Network, schema: Any) -> None:
    response = network.chat(model=TINY, messages=PROMPT, max_tokens=8, temperature=0)

    assert response.status_code == 200, response.text
    assert_conforms(schema, "POST", "/v1/chat/completions", response)
    assert response.json()["meshnet"]["hops"][0]["node_id"] == network.nodes["whole"].node_id


def test_a_chat_may_send_stop_and_seed_as_null_as_the_schema_says(
    network: Network, schema: Any
) -> None:
    """OpenAI clients send unset options as null; ``stop: null`` was refused (found by
    schemathesis: a schema-valid request answered 400)."""
    response = network.chat(model=TINY, messages=PROMPT, max_tokens=4, stop=None, seed=None)

    assert response.status_code == 200, response.text
    assert_conforms(schema, "POST", "/v1/chat/completions", response)


def test_every_event_of_a_streamed_chat_matches_the_schema(network: Network, schema: Any) -> None:
    response = httpx.post(
        f"{network.url}/v1/chat/completions",
        json={"model": TINY, "messages": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True},
        headers=network.headers(),
        timeout=120,
    )

    assert response.status_code == 200, response.text
    assert_conforms(schema, "POST", "/v1/chat/completions", response)
    events = [sse_data(line) for line in response.text.splitlines() if line]
    assert events[0]["meshnet"]["route"] and events[-1] == SSE_DONE
    assert events[-2]["usage"]["completion_tokens"] == 8


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_logprobs_and_n_choices_match_the_schema(
    network: Network, schema: Any, stream: bool
) -> None:
    body = {"model": TINY, "messages": PROMPT, "max_tokens": 4, "n": 2, "stream": stream}
    response = httpx.post(
        f"{network.url}/v1/chat/completions",
        json={**body, "logprobs": True, "top_logprobs": 2},
        headers=network.headers(),
        timeout=120,
    )

    assert response.status_code == 200, response.text
    assert_conforms(schema, "POST", "/v1/chat/completions", response)


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "Once upon", "max_tokens": 3},
        {"prompt": ["Once", "upon"], "max_tokens": 2, "n": 2, "logprobs": 2},
        {"prompt": "Once upon", "max_tokens": 0, "echo": True, "logprobs": 1},
    ],
    ids=["text", "prompts-n-logprobs", "echo-scores"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_text_completions_match_the_schema(
    network: Network, schema: Any, body: dict[str, Any], stream: bool
) -> None:
    response = httpx.post(
        f"{network.url}/v1/completions",
        json={"model": TINY, **body, "stream": stream},
        headers=network.headers(),
        timeout=120,
    )

    assert response.status_code == 200, response.text
    assert_conforms(schema, "POST", "/v1/completions", response)


def test_a_chunk_that_breaks_the_schema_is_caught(network: Network, schema: Any) -> None:
    """The stream check reads each event's JSON: a chunk without its ``choices`` fails it."""
    response = httpx.post(
        f"{network.url}/v1/chat/completions",
        json={"model": TINY, "messages": PROMPT, "max_tokens": 2, "stream": True},
        headers=network.headers(),
        timeout=120,
    )
    broken = schemathesis.Response.from_any(response)
    broken.content = response.content.replace(b'"choices"', b'"chosen"', 1)

    with pytest.raises(FailureGroup, match=r"SSE event violates schema\s+Event #0"):
        assert_conforms(schema, "POST", "/v1/chat/completions", broken)


def test_the_read_endpoints_answer_what_the_schema_documents(network: Network, schema: Any) -> None:
    client = httpx.Client(base_url=network.url, timeout=30)
    with staff_client(network) as staff:
        answers = {
            ("GET", "/v1/models"): client.get("/v1/models"),
            ("GET", "/v1/routing"): client.get("/v1/routing", headers=network.headers()),
            ("GET", "/.well-known/meshnet-tracker-key"): client.get(
                "/.well-known/meshnet-tracker-key"
            ),
            ("GET", "/healthz"): client.get("/healthz"),
            ("GET", "/metrics"): client.get("/metrics"),
            ("GET", "/api/schema/"): client.get("/api/schema/"),
        }
        staff_table = staff.get("/v1/routing", params={"model": TINY})

    for (method, path), response in answers.items():
        assert response.status_code == 200, (path, response.text)
        assert_conforms(schema, method, path, response)
    assert_conforms(schema, "GET", "/v1/routing", staff_table)
    assert [m["id"] for m in answers["GET", "/v1/models"].json()["data"]] == [TINY]
    hop = staff_table.json()["models"][0]["routes"][0]["hops"][0]
    assert hop["endpoint"] == network.nodes["whole"].endpoint


def test_a_node_signed_by_its_wallet_registers_beats_and_leaves_as_documented(
    network: Network, schema: Any, responder: ChallengeResponder
) -> None:
    # Layers 1-2 join no route of the running node: the chat tests are not disturbed.
    body = proven_registration(responder, shard_start=1, shard_end=2)

    registered = httpx.post(f"{network.url}/api/nodes/register", json=body, timeout=30)
    node = registered.json()
    token = {"Authorization": f"Bearer {node.get('node_token')}"}
    beat = httpx.post(
        f"{network.url}/api/nodes/{node.get('node_id')}/heartbeat",
        json={"active_sessions": 0, "queue_depth": 0, "measured_tps": 1.5},
        headers=token,
        timeout=30,
    )
    left = httpx.post(
        f"{network.url}/api/nodes/{node.get('node_id')}/deregister", headers=token, timeout=30
    )

    assert registered.status_code == 201, registered.text
    assert beat.status_code == 200, beat.text
    assert left.status_code == 204, left.text
    assert_conforms(schema, "POST", "/api/nodes/register", registered)
    assert_conforms(schema, "POST", "/api/nodes/{node_id}/heartbeat", beat)
    assert_conforms(schema, "POST", "/api/nodes/{node_id}/deregister", left)
    assert beat.json()["measured_tps"] == 1.5


REFUSALS = [
    # (what, method, path template, request, status, code)
    (
        "chat without a key",
        "POST",
        "/v1/chat/completions",
        {"json": {"model": TINY, "messages": PROMPT}},
        401,
        "invalid_api_key",
    ),
    (
        "chat with an unknown model",
        "POST",
        "/v1/chat/completions",
        {"json": {"model": "nope", "messages": PROMPT}, "key": True},
        404,
        "model_not_found",
    ),
    (
        "chat with a bad temperature",
        "POST",
        "/v1/chat/completions",
        {"json": {"model": TINY, "messages": PROMPT, "temperature": 9}, "key": True},
        400,
        "invalid_request",
    ),
    (
        "chat asking for the older functions",
        "POST",
        "/v1/chat/completions",
        {"json": {"model": TINY, "messages": PROMPT, "functions": [{"name": "x"}]}, "key": True},
        400,
        "unsupported_parameter",
    ),
    (
        "a text completion without a key",
        "POST",
        "/v1/completions",
        {"json": {"model": TINY, "prompt": "x"}},
        401,
        "invalid_api_key",
    ),
    (
        "a text completion of token ids",
        "POST",
        "/v1/completions",
        {"json": {"model": TINY, "prompt": [1, 2]}, "key": True},
        400,
        "invalid_request",
    ),
    (
        "a text completion with a logit_bias id past the vocabulary",
        "POST",
        "/v1/completions",
        {"json": {"model": TINY, "prompt": "x", "logit_bias": {"99999": 1}}, "key": True},
        400,
        "bad_sampling",
    ),
    (
        "chat with a body that is not JSON",
        "POST",
        "/v1/chat/completions",
        {"content": b"{", "key": True},
        400,
        "invalid_json",
    ),
    ("routing without a key", "GET", "/v1/routing", {}, 401, "invalid_api_key"),
    (
        "routing of an unknown model",
        "GET",
        "/v1/routing",
        {"params": {"model": "nope"}, "key": True},
        404,
        "model_not_found",
    ),
    (
        "routing of a model that is not a slug",
        "GET",
        "/v1/routing",
        {"params": {"model": "tiny\x00"}, "key": True},
        400,
        "invalid_request",
    ),
    (
        "a registration signed by another wallet",
        "POST",
        "/api/nodes/register",
        {"json": {**signed_registration(), "wallet": "ab" * 32}},
        401,
        "invalid_signature",
    ),
    (
        "a registration with a field out of range",
        "POST",
        "/api/nodes/register",
        {"json": signed_registration(Ed25519PrivateKey.generate(), shard_start=-1)},
        400,
        "invalid_request",
    ),
    (
        "a registration that is not JSON",
        "POST",
        "/api/nodes/register",
        {"content": b"{", "headers": {"Content-Type": "application/json"}},
        400,
        "invalid_json",
    ),
    (
        "a registration as text",
        "POST",
        "/api/nodes/register",
        {"content": b"hello", "headers": {"Content-Type": "text/plain"}},
        415,
        "unsupported_media_type",
    ),
    (
        "a registration as a form",
        "POST",
        "/api/nodes/register",
        {"data": {"wallet": "ab" * 32}},
        415,
        "unsupported_media_type",
    ),
    (
        "a heartbeat without a token",
        "POST",
        "/api/nodes/{node_id}/heartbeat",
        {"json": {"active_sessions": 0, "queue_depth": 0}},
        401,
        "missing_node_token",
    ),
    (
        "a heartbeat with a wrong token",
        "POST",
        "/api/nodes/{node_id}/heartbeat",
        {"json": {"active_sessions": 0, "queue_depth": 0}, "key": True},
        401,
        "invalid_node_token",
    ),
    (
        "a heartbeat for a node id with a NUL byte",
        "POST",
        "/api/nodes/{node_id}/heartbeat",
        {"json": {"active_sessions": 0, "queue_depth": 0}, "key": True, "node_id": "a%00b"},
        401,
        "invalid_node_token",
    ),
    (
        "a deregistration with a wrong token",
        "POST",
        "/api/nodes/{node_id}/deregister",
        {"key": True},
        401,
        "invalid_node_token",
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "request_", "status", "code"),
    [refusal[1:] for refusal in REFUSALS],
    ids=[refusal[0] for refusal in REFUSALS],
)
def test_a_refusal_is_a_documented_status_with_the_error_body(
    network: Network,
    schema: Any,
    method: str,
    path: str,
    request_: dict[str, Any],
    status: int,
    code: str,
) -> None:
    request = dict(request_)
    headers = {**request.pop("headers", {}), **(network.headers() if request.pop("key", 0) else {})}
    url = network.url + path.replace("{node_id}", request.pop("node_id", "no-such-node"))

    response = httpx.request(method, url, headers=headers, timeout=30, **request)

    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert_conforms(schema, method, path, response)
