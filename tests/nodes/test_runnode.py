"""``manage.py runnode`` against a real tracker process: register, heartbeat (with the
prefix cache's figures), serve, leave."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx

from tests.support.network import Tracker
from tests.support.nodes import generate_body, read_stream, runnode
from tests.support.plans import signed, tracker_key
from tests.support.sse import completion
from tracker_app.localnet import wait_until

# Byte-level tokens: a prompt of several blocks of 32 (ADR-0027).
LONG = "You are a careful assistant. Answer briefly and cite nothing. " * 4


def test_nodes_register_heartbeat_serve_and_deregister_on_sigterm(
    tmp_path: Path, tracker: Tracker
) -> None:
    head = runnode(tmp_path, tracker, (0, 1))
    tail = runnode(tmp_path, tracker, (2, 3))
    try:
        head.node_id, tail.node_id = head.wait_serving(), tail.wait_serving()
        rows = tracker.query(
            "SELECT id, endpoint, shard_start, shard_end, status, benchmark_tps "
            "FROM nodes_app_node ORDER BY shard_start"
        )
        assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
            (head.node_id, head.endpoint, 0, 1),
            (tail.node_id, tail.endpoint, 2, 3),
        ]
        assert all(r[4] == "online" and r[5] > 0 for r in rows)
        assert "Bearer" not in head.output() and "node_token" not in head.output()

        first_beat = tracker.query(
            "SELECT last_heartbeat_at FROM nodes_app_node WHERE id = %s", head.node_id
        )[0][0]
        wait_until(
            lambda: (
                tracker.query(
                    "SELECT last_heartbeat_at FROM nodes_app_node WHERE id = %s", head.node_id
                )[0][0]
                != first_beat
            )
        )

        # The same long prompt twice in one scope: the second run's hops start past
        # the cached blocks, and the tail's heartbeats tell the tracker.
        for _ in range(2):
            body = generate_body([(head, 0, 1), (tail, 2, 3)], content=LONG, max_tokens=8)
            body["plan"]["prefix_scope"] = "key:runnode"
            frames = read_stream(head.endpoint, signed(body, tracker_key(tracker.key_file)))
            assert completion(frames)[2]["usage"]["completion_tokens"] == 8
            wait_until(lambda: tail.health()["active_sessions"] == 0)
        wait_until(
            lambda: tracker.query(
                "SELECT measured_tps > 0 AND prefix_cache_load > 0 AND prefix_hits > 0 "
                "FROM nodes_app_node WHERE id = %s",
                tail.node_id,
            )[0][0]
        )

        head.process.signal(signal.SIGTERM)
        assert head.process.wait(timeout=20) == 0
        assert "deregistered" in head.output()
        status = tracker.query("SELECT status FROM nodes_app_node WHERE id = %s", head.node_id)
        assert status[0][0] != "online"
    finally:
        head.stop()
        tail.stop()


def test_ctrl_c_also_deregisters(tmp_path: Path, tracker: Tracker) -> None:
    node = runnode(tmp_path, tracker, (0, 3))
    try:
        node_id = node.wait_serving()
        node.process.signal(signal.SIGINT)
        assert node.process.wait(timeout=20) == 0
        status = tracker.query("SELECT status FROM nodes_app_node WHERE id = %s", node_id)
        assert status[0][0] != "online"
    finally:
        node.stop()


def test_the_tracker_refuses_a_layer_count_that_disagrees_with_the_catalogue(
    tmp_path: Path, tracker: Tracker
) -> None:
    # The tiny model's 4 layers announced as smollm2-135m (30 layers in the catalogue).
    node = runnode(
        tmp_path, tracker, (0, 3), "--weights", "builtin:tiny-random-llama",
        model="smollm2-135m",
    )  # fmt: skip
    try:
        assert node.process.wait(timeout=60) != 0
        assert "refused registration" in node.output()
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{node.endpoint}/v1/health", timeout=0.5)
            except httpx.HTTPError:
                break
        else:
            raise AssertionError("a refused node must not keep serving")
    finally:
        node.stop()


def test_a_bfloat16_int8_head_registers_its_precision_and_serves_in_front_of_a_float32_tail(
    tmp_path: Path, tracker: Tracker
) -> None:
    head = runnode(tmp_path, tracker, (0, 1), "--dtype", "bfloat16", "--quantize", "int8")
    tail = runnode(tmp_path, tracker, (2, 3))
    try:
        head.node_id, tail.node_id = head.wait_serving(), tail.wait_serving()
        rows = tracker.query(
            "SELECT id, precision FROM nodes_app_node WHERE id IN (%s, %s) ORDER BY shard_start",
            head.node_id,
            tail.node_id,
        )
        assert rows == [(head.node_id, "bfloat16+int8"), (tail.node_id, "float32")]
        assert " on cpu bfloat16+int8 in " in head.output()
        assert " on cpu bfloat16+int8 (+" in head.output()

        body = generate_body([(head, 0, 1), (tail, 2, 3)], max_tokens=8)
        frames = read_stream(head.endpoint, signed(body, tracker_key(tracker.key_file)))
        assert completion(frames)[2]["usage"]["completion_tokens"] == 8
    finally:
        head.stop()
        tail.stop()
