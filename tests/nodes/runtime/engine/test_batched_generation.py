"""Sessions whose steps a node batches answer exactly as each would alone.

Real node processes on the tiny model (dev-open, called straight at the
head's ``/v1/generate``): a head over layers 0-1 and two tails over 2-3, so
sessions of different routes share the head's batches (a third tail,
started by the test that kills it, stands in for a dying hop). Every session's
greedy token ids must equal those of the same prompt run alone, whether the
sessions start together, join a running batch, or run beside one that is
cancelled or whose hop dies. SmolLM2's batched steps are compared in
``test_batching_smollm2.py`` on a NodeService, where its load is paid once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.nodes import TINY, generate_body, read_stream, start_node
from tests.support.sse import chunks_of, completion, iter_sse
from tracker_app.localnet import NodeProcess, wait_until

PROMPTS = (
    "Hello there",
    "Count the nodes of the mesh.",
    "What is a layer?",
    "Tell me about meshes.",
    "Why split a model?",
    "Name three colours.",
)
# Long enough that every session is still decoding when the last one starts.
MAX_TOKENS = 96

Answer = tuple[str, list[int], str]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, NodeProcess]]:
    tmp: Path = tmp_path_factory.mktemp("batched")
    started = {
        name: start_node(tmp, TINY, layers, node_id=f"batched-{name}")
        for name, layers in {"head": (0, 1), "tail-a": (2, 3), "tail-b": (2, 3)}.items()
    }
    try:
        for node in started.values():
            node.wait_serving(timeout=120)
        yield started
    finally:
        for node in started.values():
            node.stop()


def body_for(nodes: dict[str, NodeProcess], prompt: str, tail: str = "tail-a") -> dict[str, Any]:
    return generate_body(
        [(nodes["head"], 0, 1), (nodes[tail], 2, 3)], content=prompt, max_tokens=MAX_TOKENS
    )


def answer_of(frames: list[Any]) -> Answer:
    text, token_ids, last = completion(frames)
    return text, token_ids, last["choices"][0]["finish_reason"]


@pytest.fixture(scope="module")
def alone(nodes: dict[str, NodeProcess]) -> dict[str, Answer]:
    """Each prompt's greedy answer with no other session on the nodes."""
    return {
        prompt: answer_of(read_stream(nodes["head"].endpoint, body_for(nodes, prompt)))
        for prompt in PROMPTS
    }


def stream(
    nodes: dict[str, NodeProcess],
    prompt: str,
    *,
    tail: str = "tail-a",
    on_content: Callable[[], object] = lambda: None,
    stop_after: int | None = None,
) -> list[Any]:
    """One session's frames; ``on_content`` runs at its first text; ``stop_after`` cancels it."""
    frames: list[Any] = []
    for frame in iter_sse(f"{nodes['head'].endpoint}/v1/generate", body_for(nodes, prompt, tail)):
        frames.append(frame)
        content = [c for c in chunks_of(frames) if c["choices"][0]["delta"].get("content")]
        if len(content) == 1 and content[0] is frames[-1]:
            on_content()
        if stop_after is not None and len(content) >= stop_after:
            break  # closing the stream cancels the generation
    return frames


def batched_steps(node: NodeProcess) -> int:
    """Steps this node ran in a batch of more than one session, so far."""
    return int(node.health()["batched_steps"])


def no_sessions_left(nodes: dict[str, NodeProcess]) -> None:
    wait_until(
        lambda: all(node.health()["active_sessions"] == 0 for node in nodes.values()),
        timeout=30,
        what="every node to free every session",
    )


def test_sessions_decoding_together_each_get_their_lone_greedy_answer(
    nodes: dict[str, NodeProcess], alone: dict[str, Answer]
) -> None:
    before = {name: batched_steps(node) for name, node in nodes.items()}
    start = threading.Barrier(len(PROMPTS))

    def together(prompt: str) -> Answer:
        start.wait()
        return answer_of(stream(nodes, prompt))

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = dict(zip(PROMPTS, pool.map(together, PROMPTS), strict=True))

    assert answers == alone
    assert batched_steps(nodes["head"]) > before["head"]
    assert batched_steps(nodes["tail-a"]) > before["tail-a"]
    no_sessions_left(nodes)


def test_sessions_joining_a_running_batch_change_no_answer(
    nodes: dict[str, NodeProcess], alone: dict[str, Answer]
) -> None:
    first, later = PROMPTS[:3], PROMPTS[3:]
    decoding = threading.Barrier(len(first) + 1)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        running = {p: pool.submit(stream, nodes, p, on_content=decoding.wait) for p in first}
        decoding.wait(timeout=60)  # every first session has produced text
        joined = {p: pool.submit(stream, nodes, p) for p in later}
        answers = {p: answer_of(f.result()) for p, f in {**running, **joined}.items()}

    assert answers == alone
    no_sessions_left(nodes)


def test_a_session_cancelled_mid_batch_leaves_the_others_their_lone_answers(
    nodes: dict[str, NodeProcess], alone: dict[str, Answer]
) -> None:
    cancelled, *kept = PROMPTS[:4]
    with ThreadPoolExecutor(4) as pool:
        others = {p: pool.submit(stream, nodes, p) for p in kept}
        stopped = pool.submit(stream, nodes, cancelled, stop_after=3)
        answers = {p: answer_of(f.result()) for p, f in others.items()}
        cut = stopped.result()

    assert answers == {p: alone[p] for p in kept}
    assert chunks_of(cut)[-1]["choices"][0]["finish_reason"] is None
    no_sessions_left(nodes)


def test_a_hop_dying_mid_batch_fails_only_the_sessions_it_served(
    nodes: dict[str, NodeProcess], alone: dict[str, Answer], tmp_path: Path
) -> None:
    # A tail of its own to kill, so that the module's nodes serve every test.
    doomed = start_node(tmp_path, TINY, (2, 3), node_id="batched-doomed")
    with doomed.process:
        doomed.wait_serving(timeout=120)
        route = {**nodes, "doomed": doomed}
        on_doomed, on_b = PROMPTS[:3], PROMPTS[3:]
        decoding = threading.Barrier(len(PROMPTS) + 1)
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            futures: dict[str, Future[list[Any]]] = {
                p: pool.submit(
                    stream,
                    route,
                    p,
                    tail="doomed" if p in on_doomed else "tail-b",
                    on_content=decoding.wait,
                )
                for p in PROMPTS
            }
            decoding.wait(timeout=60)
            doomed.kill()
            frames = {p: f.result() for p, f in futures.items()}

    for prompt in on_doomed:
        errors = [f["error"] for f in frames[prompt] if isinstance(f, dict) and "error" in f]
        assert [e["node_id"] for e in errors] == ["batched-doomed"], prompt
    assert {p: answer_of(frames[p]) for p in on_b} == {p: alone[p] for p in on_b}
