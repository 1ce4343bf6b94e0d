"""The chat API end to end: a real tracker, real `runnode` processes on the tiny model."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
import websockets
from openai.types.chat import ChatCompletionMessageParam

from nodes_app.runtime.loading.tiny import tiny_config
from tests.support.network import (
    Network,
    head_frames,
    head_tail_answer,
    redundant_tiny_network,
    start_network,
)
from tests.support.sse import chunks_of, text_of
from tracker_app.localnet import fresh_process_database, manage_argv, run_checked, wait_until

TINY = "tiny-random-llama"
PROMPT = [{"role": "user", "content": "Tell me about meshes."}]


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    """Tracker + head (layers 0-1) + tail (2-3): one route, so every answer is predictable."""
    with fresh_process_database() as database_url:
        tmp = tmp_path_factory.mktemp("chat-e2e")
        for network in start_network(database_url, tmp, MESHNET_RATE_LIMIT_PER_MINUTE="1000"):
            network.add_node("head", TINY, (0, 1), wait=False)
            network.add_node("tail", TINY, (2, 3), wait=False)
            network.wait_for_nodes()
            yield network


def test_a_streamed_answer_is_the_nodes_own_answer_in_openai_chunks(network: Network) -> None:
    frames = network.stream(model=TINY, messages=PROMPT, max_tokens=24, temperature=0)

    chunks = chunks_of(frames)
    assert frames[-1] == "[DONE]"
    assert text_of(frames) == head_tail_answer(network, PROMPT, 24)
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    meshnet = chunks[0]["meshnet"]
    head, tail = network.nodes["head"], network.nodes["tail"]
    assert meshnet["route"] == f"{TINY} | {head.node_id}[0-1] -> {tail.node_id}[2-3]"
    assert meshnet["mode"] in {"greedy-fallback", "exploit", "scout"}
    assert [h["start_layer"] for h in meshnet["hops"]] == [0, 2]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 24
    assert all("meshnet_token_ids" not in c for c in chunks)


def test_a_non_streamed_answer_is_recorded_and_billed_to_the_cent(network: Network) -> None:
    response = network.chat(model=TINY, messages=PROMPT, max_tokens=20, temperature=0)

    assert response.status_code == 200, response.text
    reply = response.json()
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"]["content"] == head_tail_answer(network, PROMPT, 20)
    usage = reply["usage"]
    assert usage["completion_tokens"] == 20
    assert usage["total_tokens"] == usage["prompt_tokens"] + 20

    [(request_id, status, prompt, completion, signature, ttft, tps, cached)] = network.query(
        "SELECT id, status, prompt_tokens, completion_tokens, route_signature, "
        "time_to_first_token_ms, tokens_per_second, cached_tokens FROM tracker_app_chatrequest "
        "WHERE completion_tokens = 20 AND stream = %s",
        False,
    )
    assert (status, prompt, completion) == ("completed", usage["prompt_tokens"], 20)
    # The streamed test sent this prompt with this key first: its whole blocks may be
    # reused (ADR-0027), billed at the prompt price (the model sets no cached price).
    assert cached == usage["prompt_tokens_details"]["cached_tokens"] < prompt
    assert signature == reply["meshnet"]["route"]
    assert ttft > 0 and tps > 0
    [(billing_id, charge, fee)] = network.query(
        "SELECT id, charge, network_fee FROM tracker_app_billingrecord WHERE request_id = %s",
        request_id,
    )
    # tiny-random-llama costs 0.01 per 1k prompt and 0.02 per 1k completion tokens.
    expected = Decimal(prompt) * Decimal("0.00001") + Decimal("0.000400")
    assert Decimal(str(charge)) == expected > 0
    units = network.query(
        "SELECT node_id, start_layer, end_layer, tokens, units, amount FROM tracker_app_workunit "
        "WHERE billing_id = %s ORDER BY start_layer",
        billing_id,
    )
    head, tail = network.nodes["head"], network.nodes["tail"]
    computed = prompt - cached + 20  # each hop is paid for the positions it computed
    assert [(u[0], u[1], u[2], u[3], u[4]) for u in units] == [
        (head.node_id, 0, 1, computed, computed * 2),
        (tail.node_id, 2, 3, computed, computed * 2),
    ]
    paid = sum((Decimal(str(u[5])) for u in units), Decimal(0))
    assert paid == Decimal(str(charge)) - Decimal(str(fee))


def staff_cookie(network: Network) -> str:
    run_checked(
        manage_argv(
            "createsuperuser", "--noinput", "--username", "staff", "--email", "staff@example.com"
        ),
        env={**network.env, "DJANGO_SUPERUSER_PASSWORD": "pw-e2e"},
    )
    with httpx.Client(base_url=network.url) as client:
        page = client.get("/admin/login/")
        token = page.text.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
        client.post(
            "/admin/login/?next=/admin/",
            data={"username": "staff", "password": "pw-e2e", "csrfmiddlewaretoken": token},
        )
        return f"sessionid={client.cookies['sessionid']}"


def test_the_dashboard_sees_the_proxy_events_in_order(network: Network) -> None:
    cookie = staff_cookie(network)
    ws_url = network.url.replace("http://", "ws://") + "/ws/dashboard/"

    async def watch() -> list[dict[str, Any]]:
        async with websockets.connect(
            ws_url, additional_headers={"Cookie": cookie, "Origin": network.url}
        ) as socket:
            hello = json.loads(await socket.recv())
            assert hello["type"] == "snapshot"
            await asyncio.to_thread(
                network.stream, model=TINY, messages=PROMPT, max_tokens=30, temperature=0
            )
            events: list[dict[str, Any]] = []
            while not events or events[-1]["kind"] not in {"proxy complete", "proxy error"}:
                message = json.loads(await asyncio.wait_for(socket.recv(), 10))
                if "event" in message:  # a proxy event (other kinds interleave)
                    events.append(message["event"])
            return events

    events = asyncio.run(watch())

    kinds = [e["kind"] for e in events]
    assert kinds[:2] == ["proxy route selected", "proxy connected"]
    assert kinds[-1] == "proxy complete"
    assert set(kinds[2:-1]) <= {"proxy progress"}
    assert len({e["request_id"] for e in events}) == 1
    assert events[0]["data"]["mode"] in {"greedy-fallback", "exploit", "scout"}
    assert events[-1]["data"]["completion_tokens"] == 30


def test_a_client_that_disconnects_frees_every_hops_cache_and_pays_for_what_it_was_sent(
    network: Network,
) -> None:
    with httpx.stream(
        "POST",
        f"{network.url}/v1/chat/completions",
        # The end-of-text token barred: a sampled answer must not end by itself before the
        # client leaves (it once did, after 2 tokens, and nothing was left to cancel).
        json={
            "model": TINY,
            "messages": PROMPT,
            "max_tokens": 4000,
            "stream": True,
            "logit_bias": {str(tiny_config().eos_token_id): -100},
        },
        headers=network.headers(),
        timeout=60,
    ) as response:
        lines = response.iter_lines()
        received = [next(lines) for _ in range(6)]
    read = sum('"content":"' in line and '"content":""' not in line for line in received)
    assert read

    def caches_freed() -> bool:
        return [node.health()["cached_sessions"] for node in network.nodes.values()] == [0, 0]

    def recorded_cancelled() -> list[tuple[Any, ...]]:
        # The nodes see the closed stream before the tracker has written the record.
        return network.query(
            "SELECT id, prompt_tokens, completion_tokens FROM tracker_app_chatrequest "
            "WHERE status = 'cancelled' AND stream = %s",
            True,
        )

    wait_until(caches_freed, timeout=20, what="every hop to free its cache", interval=0.2)
    wait_until(
        lambda: bool(recorded_cancelled()), timeout=20, what="the request recorded cancelled"
    )
    [(request_id, prompt, sent)] = recorded_cancelled()
    # Billed for every token the tracker sent, at least those the client read (OpenAI's rule).
    assert read <= sent < 4000
    [(charge,)] = network.query(
        "SELECT charge FROM tracker_app_billingrecord WHERE request_id = %s", request_id
    )
    assert charge > 0
    units = network.query(
        "SELECT w.node_id, w.tokens FROM tracker_app_workunit w "
        "JOIN tracker_app_billingrecord b ON w.billing_id = b.id WHERE b.request_id = %s",
        request_id,
    )
    assert sorted(units) == sorted((n.node_id, prompt + sent) for n in network.nodes.values())


def error_of(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    # OpenAI's shape: ``param`` too when the error names the request field at fault.
    assert {"message", "type", "code"} <= set(error) <= {"message", "type", "code", "param"}
    return str(error["message"])


def test_bad_requests_get_their_status_and_the_openai_error_shape(network: Network) -> None:
    url = f"{network.url}/v1/chat/completions"
    good = {"model": TINY, "messages": PROMPT, "max_tokens": 4}

    assert "JSON" in error_of(
        httpx.post(url, content=b"{oops", headers=network.headers()), 400, "invalid_json"
    )
    too_hot = httpx.post(url, json={**good, "temperature": 9}, headers=network.headers())
    assert "temperature" in error_of(too_hot, 400, "invalid_request")
    assert too_hot.json()["error"]["param"] == "temperature"
    assert "API key" in error_of(httpx.post(url, json=good), 401, "invalid_api_key")
    assert "API key" in error_of(
        httpx.post(url, json=good, headers=network.headers("mk-wrong")), 401, "invalid_api_key"
    )
    assert "gpt-9" in error_of(
        httpx.post(url, json={**good, "model": "gpt-9"}, headers=network.headers()),
        404,
        "model_not_found",
    )
    assert "layers 0-29" in error_of(
        httpx.post(url, json={**good, "model": "smollm2-135m"}, headers=network.headers()),
        503,
        "no_route",
    )
    assert "context" in error_of(
        httpx.post(url, json={**good, "max_tokens": 4096}, headers=network.headers()),
        400,
        "context_length_exceeded",
    )
    tail = network.nodes["tail"]
    assert error_of(
        httpx.post(url, json={**good, "route": [tail.node_id]}, headers=network.headers()),
        400,
        "invalid_route",
    )
    # ... and the tracker still serves.
    assert network.chat(**good).status_code == 200


def test_the_models_endpoint_lists_the_model_the_nodes_serve(network: Network) -> None:
    listed = httpx.get(f"{network.url}/v1/models").json()

    assert [m["id"] for m in listed["data"]] == [TINY]


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[Network]:
    with fresh_process_database() as database_url:
        yield from start_network(database_url, tmp_path, MESHNET_RATE_LIMIT_PER_MINUTE="2")


def test_a_key_over_its_rate_limit_gets_429_with_retry_after(limited: Network) -> None:
    body = {"model": TINY, "messages": PROMPT}
    while True:  # the limit counts per clock minute: keep the three requests in one
        minute = int(time.time() // 60)
        answers = [limited.chat(**body) for _ in range(3)]
        if int(time.time() // 60) == minute:
            break
        time.sleep(1)
        limited.api_key = limited.create_api_key("fresh-window")

    assert [a.status_code for a in answers[:2]] == [503, 503]  # counted, but no nodes yet
    assert "Rate limit of 2" in error_of(answers[2], 429, "rate_limit_exceeded")
    assert 1 <= int(answers[2].headers["Retry-After"]) <= 60


@pytest.fixture
def redundant(tmp_path: Path) -> Iterator[Network]:
    """Two routes for the tiny model: head 0-1 -> tail 2-3, and one whole node 0-3."""
    yield from redundant_tiny_network(tmp_path)


def test_killing_the_tail_mid_stream_still_gives_the_whole_uninterrupted_answer(
    redundant: Network,
) -> None:
    whole = redundant.nodes["whole"]
    # Long enough for a few 32-token blocks: both routes hold it once asked (ADR-0027).
    prompt = [{"role": "user", "content": "Tell me about meshes and their routes. " * 5}]
    asked: dict[str, Any] = {"logprobs": True, "top_logprobs": 2}
    direct = head_frames(
        redundant,
        whole,
        [whole.hop()],
        model=TINY,
        messages=prompt,
        max_tokens=400,
        temperature=0.0,
        **asked,
    )
    expected = text_of(direct)
    for route in (["head", "tail"], ["whole"]):
        pinned = [redundant.nodes[name].node_id for name in route]
        answer = redundant.chat(model=TINY, messages=prompt, max_tokens=1, route=pinned)
        assert answer.status_code == 200, answer.text
    nodes = list(redundant.nodes.values())
    wait_until(lambda: all(node.health()["active_sessions"] == 0 for node in nodes))
    frames: list[Any] = []
    killed = None
    for frame in redundant.iter_stream(
        model=TINY, messages=prompt, max_tokens=400, temperature=0, **asked
    ):
        frames.append(frame)
        content = [c for c in chunks_of(frames) if c["choices"][0]["delta"].get("content")]
        if killed is None and content:
            last_hop = chunks_of(frames)[0]["meshnet"]["hops"][-1]["node_id"]
            killed = next(n for n in redundant.nodes.values() if n.node_id == last_hop)
            killed.kill()

    assert killed is not None
    assert frames[-1] == "[DONE]"
    assert not [f for f in frames if isinstance(f, dict) and "error" in f]
    assert text_of(frames) == expected
    # The logprobs survive the failover: each token's, the replayed route's included,
    # is the whole model's (within float rounding of a prefill against decode steps).
    got, wanted = logprobs_of(frames), logprobs_of(direct)
    assert [token for token, _ in got] == [token for token, _ in wanted] and len(got) == 400
    assert [p for _, p in got] == pytest.approx([p for _, p in wanted], abs=1e-4)
    usage = chunks_of(frames)[-1]["usage"]
    assert usage["completion_tokens"] == 400
    # The replay's route took the prompt from its prefix cache (its last block excepted).
    assert usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 64
    [(status, signature)] = redundant.query(
        "SELECT status, route_signature FROM tracker_app_chatrequest WHERE mode <> 'pinned'"
    )
    assert status == "completed"
    assert killed.node_id not in signature
    # Both routes delivered tokens, so both are paid for their work.
    first_route = {hop["node_id"] for hop in chunks_of(frames)[0]["meshnet"]["hops"]}
    final_route = {n.node_id for n in redundant.nodes.values() if n.node_id in signature}
    billed = {
        row[0]
        for row in redundant.query(
            "SELECT w.node_id FROM tracker_app_workunit w "
            "JOIN tracker_app_billingrecord b ON w.billing_id = b.id "
            "JOIN tracker_app_chatrequest r ON b.request_id = r.id WHERE r.mode <> 'pinned'"
        )
    }
    assert billed == first_route | final_route


def logprobs_of(frames: list[Any]) -> list[tuple[str, float]]:
    """(token, logprob) of every token of a chat stream's chunks, in order."""
    return [
        (entry["token"], entry["logprob"])
        for chunk in chunks_of(frames)
        for entry in (chunk["choices"][0].get("logprobs") or {}).get("content", [])
    ]


def test_a_pinned_route_through_a_dead_node_is_a_502_and_is_not_charged(
    redundant: Network,
) -> None:
    whole = redundant.nodes["whole"]
    whole.kill()

    response = redundant.chat(model=TINY, messages=PROMPT, max_tokens=8, route=[whole.node_id])

    assert whole.node_id in error_of(response, 502, "upstream_failed")
    assert redundant.query("SELECT status FROM tracker_app_chatrequest") == [("failed",)]
    assert not redundant.query("SELECT id FROM tracker_app_billingrecord")
    # The tracker goes on serving on the route that is left.
    assert redundant.chat(model=TINY, messages=PROMPT, max_tokens=8).status_code == 200


def test_the_openai_python_client_chats_through_the_tracker(network: Network) -> None:
    client = openai.OpenAI(base_url=f"{network.url}/v1", api_key=network.api_key)
    # The same list of plain dicts: the OpenAI client types its messages as TypedDicts.
    messages = cast("list[ChatCompletionMessageParam]", PROMPT)

    reply = client.chat.completions.create(
        model=TINY,
        messages=messages,
        max_tokens=12,
        temperature=0,
    )
    pieces = [
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model=TINY,
            messages=messages,
            max_tokens=12,
            temperature=0,
            stream=True,
        )
        if chunk.choices
    ]

    assert reply.choices[0].message.content == head_tail_answer(network, PROMPT, 12)
    assert "".join(pieces) == reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens == 12
    assert [m.id for m in client.models.list()] == [TINY]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=messages)


@pytest.fixture
def lonely(tmp_path: Path) -> Iterator[Network]:
    """A single whole-model node: once it dies no route is left."""
    with fresh_process_database() as database_url:
        for network in start_network(database_url, tmp_path):
            network.add_node("only", TINY, (0, 3))
            yield network


def test_when_no_route_is_left_the_stream_ends_with_an_error_and_no_charge(
    lonely: Network,
) -> None:
    lonely.nodes["only"].kill()

    frames = lonely.stream(model=TINY, messages=PROMPT, max_tokens=8, temperature=0)

    assert frames[-1] == "[DONE]"
    error = frames[-2]["error"]
    # It failed, so it is banned; its route is not quarantined, and the message says so.
    assert error["code"] == "no_route"
    assert "goes through a banned node" in error["message"]
    assert lonely.nodes["only"].node_id in error["message"]
    assert lonely.query("SELECT status FROM tracker_app_chatrequest") == [("failed",)]
    assert not lonely.query("SELECT id FROM tracker_app_billingrecord")


def test_speculation_off_answers_the_same_and_a_whole_reply_reports_its_drafts(
    network: Network,
) -> None:
    repetitive = [{"role": "user", "content": "mesh node mesh node mesh node mesh node mesh"}]
    asked = {"model": TINY, "messages": repetitive, "max_tokens": 17, "temperature": 0}

    on = network.chat(**asked)
    off = network.chat(**asked, speculation="off")

    assert on.status_code == off.status_code == 200, (on.text, off.text)
    assert on.json()["choices"] == off.json()["choices"]
    assert off.json()["meshnet"]["speculation"] == {"drafted": 0, "accepted": 0}
    drafted = on.json()["meshnet"]["speculation"]
    assert 0 <= drafted["accepted"] <= drafted["drafted"]
    assert on.json()["usage"]["completion_tokens"] == off.json()["usage"]["completion_tokens"]


def test_a_stream_with_logprobs_scores_every_token_and_reports_its_drafts_last(
    network: Network,
) -> None:
    repetitive = [{"role": "user", "content": "mesh node mesh node mesh node mesh node mesh"}]

    chunks = chunks_of(
        network.stream(
            model=TINY,
            messages=repetitive,
            max_tokens=17,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
        )
    )

    first, last = chunks[0]["meshnet"], chunks[-1]
    assert "speculation" not in first
    drafted = last["meshnet"]["speculation"]
    assert 0 <= drafted["accepted"] <= drafted["drafted"]
    assert last["meshnet"]["route"] == first["route"]
    scored = [
        c["choices"][0]["logprobs"]["content"] for c in chunks if c["choices"][0].get("logprobs")
    ]
    assert sum(map(len, scored)) == last["usage"]["completion_tokens"] > 0
