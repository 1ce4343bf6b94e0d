"""Generation across tiny-model node processes over hop links: equality, cancel, failures."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from time import time_ns

import httpx
import pytest

from tests.support.link import node_link, tiny_step
from tests.support.nodes import (
    TINY,
    generate_body,
    read_stream,
    start_node,
)
from tests.support.sse import completion
from tracker_app.localnet import NodeProcess, free_port, process_env, wait_until
from tracker_app.localnet import start_node as start_localnet_node


def test_split_route_streams_the_same_tokens_as_the_whole_model(
    tiny_nodes: dict[str, NodeProcess],
) -> None:
    head, tail, whole = tiny_nodes["head"], tiny_nodes["tail"], tiny_nodes["whole"]
    split = read_stream(head.endpoint, generate_body([(head, 0, 1), (tail, 2, 3)], max_tokens=24))
    alone = read_stream(whole.endpoint, generate_body([(whole, 0, 3)], max_tokens=24))

    split_text, split_ids, _ = completion(split)
    whole_text, whole_ids, _ = completion(alone)
    assert split_ids == whole_ids
    assert split_text == whole_text
    assert len(split_ids) == 24


def test_a_full_node_asked_to_start_mid_model_continues_a_partial_head(
    tiny_nodes: dict[str, NodeProcess],
) -> None:
    # ADR-0020: partial head 0-2, then the full node from layer 3 (not from its shard start 0).
    partial, whole = tiny_nodes["partial"], tiny_nodes["whole"]
    mixed = read_stream(partial.endpoint, generate_body([(partial, 0, 2), (whole, 3, 3)]))
    alone = read_stream(whole.endpoint, generate_body([(whole, 0, 3)]))
    assert completion(mixed)[1] == completion(alone)[1]


def test_stream_is_openai_chunks_with_usage_and_done(tiny_nodes: dict[str, NodeProcess]) -> None:
    head, tail = tiny_nodes["head"], tiny_nodes["tail"]
    frames = read_stream(head.endpoint, generate_body([(head, 0, 1), (tail, 2, 3)], max_tokens=12))

    assert frames[-1] == "[DONE]"
    chunks = frames[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len({c["id"] for c in chunks}) == 1
    text, ids, last = completion(frames)
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 12 == len(ids)
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 12
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert text


def test_stop_string_ends_the_stream_before_it(tiny_nodes: dict[str, NodeProcess]) -> None:
    head, tail = tiny_nodes["head"], tiny_nodes["tail"]
    route = [(head, 0, 1), (tail, 2, 3)]
    full_text, _, _ = completion(read_stream(head.endpoint, generate_body(route, max_tokens=20)))
    stop = full_text[5:8]
    expected = full_text[: full_text.index(stop)]

    text, _, last = completion(
        read_stream(head.endpoint, generate_body(route, max_tokens=20, stop=[stop]))
    )
    assert text == expected
    assert last["choices"][0]["finish_reason"] == "stop"


def test_resumed_generation_streams_only_the_new_tokens(
    tiny_nodes: dict[str, NodeProcess],
) -> None:
    head, tail = tiny_nodes["head"], tiny_nodes["tail"]
    route = [(head, 0, 1), (tail, 2, 3)]
    _, ids, _ = completion(read_stream(head.endpoint, generate_body(route, max_tokens=16)))

    resumed = read_stream(
        head.endpoint, generate_body(route, max_tokens=16, resume_token_ids=ids[:6])
    )
    _, new_ids, last = completion(resumed)
    assert new_ids == ids[6:]
    assert last["usage"]["completion_tokens"] == 16


def test_caches_are_freed_on_every_hop_after_a_generation(
    tiny_nodes: dict[str, NodeProcess],
) -> None:
    head, tail = tiny_nodes["head"], tiny_nodes["tail"]
    read_stream(head.endpoint, generate_body([(head, 0, 1), (tail, 2, 3)], max_tokens=4))
    wait_until(lambda: head.health()["cached_sessions"] == 0)
    wait_until(lambda: tail.health()["cached_sessions"] == 0)


def test_client_disconnect_cancels_the_session_on_every_hop(
    tiny_nodes: dict[str, NodeProcess],
) -> None:
    head, tail = tiny_nodes["head"], tiny_nodes["tail"]
    body = generate_body([(head, 0, 1), (tail, 2, 3)], max_tokens=4000)
    with httpx.stream("POST", f"{head.endpoint}/v1/generate", json=body, timeout=30) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
        assert head.health()["cached_sessions"] == 1
        assert tail.health()["cached_sessions"] == 1
    wait_until(lambda: head.health()["streams"] == 0)
    wait_until(lambda: head.health()["cached_sessions"] == 0)
    wait_until(lambda: tail.health()["cached_sessions"] == 0)


def test_a_client_leaving_a_whole_nodes_long_answer_frees_the_node_long_before_it_would_end(
    tiny_nodes: dict[str, NodeProcess],
) -> None:
    """A head serving every layer steps inline on its event loop: it must still hear its
    client leave, not generate the rest of the answer into a closed socket."""
    whole = tiny_nodes["whole"]
    began = time.monotonic()
    read_stream(whole.endpoint, generate_body([(whole, 0, 3)], max_tokens=200))
    per_token = (time.monotonic() - began) / 200
    body = generate_body([(whole, 0, 3)], max_tokens=4000)
    with httpx.stream("POST", f"{whole.endpoint}/v1/generate", json=body, timeout=30) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
    left = time.monotonic()

    wait_until(lambda: whole.health()["streams"] == whole.health()["cached_sessions"] == 0)

    assert time.monotonic() - left < 4000 * per_token / 4


def test_a_failed_hop_ends_the_stream_with_its_node_id(
    tiny_nodes: dict[str, NodeProcess],
) -> None:
    head = tiny_nodes["head"]
    body = generate_body([(head, 0, 1)])
    body["plan"]["hops"].append(
        {
            "node_id": "gone-node",
            "endpoint": f"http://127.0.0.1:{free_port()}",
            "start_layer": 2,
            "end_layer": 3,
        }
    )
    frames = read_stream(head.endpoint, body)
    assert frames[-1] == "[DONE]"
    error = frames[-2]["error"]
    assert error["type"] == "upstream_error"
    assert error["code"] == "hop_failed"
    assert error["node_id"] == "gone-node"
    wait_until(lambda: head.health()["cached_sessions"] == 0)


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda b: b["plan"]["hops"][0].update(node_id="someone-else"), "not_head"),
        (lambda b: b["plan"]["hops"][1].update(start_layer=3), "invalid_plan"),
        (lambda b: b["plan"]["hops"][1].update(end_layer=2), "invalid_plan"),
        (lambda b: b["plan"].update(model="smollm2-135m"), "wrong_model"),
        (lambda b: b.update(messages=[]), "invalid_request"),
        (lambda b: b.update(max_tokens=0), "invalid_request"),
        (lambda b: b.update(temperature=-1), "bad_sampling"),
    ],
)
def test_the_head_refuses_a_bad_plan_or_request(
    tiny_nodes: dict[str, NodeProcess], change: object, code: str
) -> None:
    head, tail = tiny_nodes["head"], tiny_nodes["tail"]
    body = generate_body([(head, 0, 1), (tail, 2, 3)])
    change(body)  # type: ignore[operator]
    response = httpx.post(f"{head.endpoint}/v1/generate", json=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code
    assert head.health()["status"] == "ok"


def test_a_node_that_does_not_start_at_layer_zero_is_not_a_head(
    tiny_nodes: dict[str, NodeProcess],
) -> None:
    tail = tiny_nodes["tail"]
    response = httpx.post(
        f"{tail.endpoint}/v1/generate", json=generate_body([(tail, 0, 3)]), timeout=30
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "not_head"


def test_idle_sessions_are_freed_and_a_full_node_answers_503(
    tmp_path: pytest.TempPathFactory,
) -> None:
    node = start_node(
        tmp_path,  # type: ignore[arg-type]
        TINY,
        (2, 3),
        node_id="tiny-small",
        extra_args=["--max-sessions", "1", "--idle-timeout", "1"],
    )
    try:
        node.wait_serving()
        hidden = bytes(4 * 64 * 3)
        with node_link(node.endpoint) as link:
            first = link.step(tiny_step("s1", 3), hidden)
            assert first.status == 200
            busy = link.step(tiny_step("s2", 3), hidden)
            assert busy.status == 503
            assert busy.code == "node_busy"
            assert node.health()["cached_sessions"] == 1
            wait_until(lambda: node.health()["cached_sessions"] == 0)
            again = link.step(tiny_step("s2", 3), hidden)
            assert again.status == 200
    finally:
        node.stop()


def test_a_hop_at_its_session_cap_ends_the_stream_as_busy_not_failed(
    tmp_path: Path, tiny_nodes: dict[str, NodeProcess]
) -> None:
    full = start_node(
        tmp_path, TINY, (2, 3), node_id="tiny-full", extra_args=["--max-sessions", "1"]
    )
    try:
        full.wait_serving()
        with node_link(full.endpoint) as link:
            assert link.step(tiny_step("occupier", 3), bytes(4 * 64 * 3)).status == 200

        head = tiny_nodes["head"]
        frames = read_stream(head.endpoint, generate_body([(head, 0, 1), (full, 2, 3)]))

        error = frames[-2]["error"]
        assert (error["code"], error["node_id"]) == ("hop_busy", "tiny-full")
        wait_until(lambda: head.health()["cached_sessions"] == 0)
    finally:
        full.stop()


def test_concurrent_generations_through_one_link_each_stream_their_own_tokens(
    tiny_nodes: dict[str, NodeProcess],
) -> None:
    # Their steps share the head's link to the tail (frames of several sessions).
    head, tail, whole = tiny_nodes["head"], tiny_nodes["tail"], tiny_nodes["whole"]
    prompts = ["Hello there", "Tell me about meshes.", "Count to ten", "Why is the sky blue?"]
    alone = [
        completion(read_stream(whole.endpoint, generate_body([(whole, 0, 3)], content=p)))[1]
        for p in prompts
    ]

    def split(prompt: str) -> list[int]:
        body = generate_body([(head, 0, 1), (tail, 2, 3)], content=prompt)
        return completion(read_stream(head.endpoint, body))[1]

    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(split, prompts))

    assert together == alone
    wait_until(lambda: tail.health()["cached_sessions"] == 0)


def test_a_link_that_drops_mid_generation_fails_the_hop_and_the_next_generation_reconnects(
    tmp_path: Path, tiny_nodes: dict[str, NodeProcess]
) -> None:
    head, whole = tiny_nodes["head"], tiny_nodes["whole"]
    port = free_port()

    def tail() -> NodeProcess:
        node = start_localnet_node(
            name=f"drop-{time_ns()}", model=TINY, layers=(2, 3), env=process_env(),
            log_dir=tmp_path, port=port, node_id="tiny-drop", dev_open=True,
        )  # fmt: skip
        node.wait_serving()
        return node

    crashing = tail()
    body = generate_body([(head, 0, 1), (crashing, 2, 3)], max_tokens=4000)
    with httpx.stream("POST", f"{head.endpoint}/v1/generate", json=body, timeout=60) as response:
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
        crashing.process.kill()  # mid-generation: no close frame, no goodbye
        frames = [line for line in lines if line.startswith("data:")]
    crashing.stop()

    assert frames[-1] == "data: [DONE]"
    assert '"code":"hop_failed"' in frames[-2] and '"node_id":"tiny-drop"' in frames[-2]
    restarted = tail()
    try:
        again = read_stream(head.endpoint, generate_body([(head, 0, 1), (restarted, 2, 3)]))
        alone = read_stream(whole.endpoint, generate_body([(whole, 0, 3)]))
        assert completion(again)[1] == completion(alone)[1]
    finally:
        restarted.stop()
