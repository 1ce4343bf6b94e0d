"""Node processes under test (with or without a tracker) and the requests tests send them."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.network import Tracker
from tests.support.sse import read_sse
from tracker_app.localnet import NodeProcess, free_port, process_env, stop_together
from tracker_app.localnet import start_node as start_localnet_node

TINY = "tiny-random-llama"
SMOLLM2 = "smollm2-135m"

# head + tail, the whole model, and a partial head (ADR-0020's topology).
LAYOUTS = {"head": (0, 1), "tail": (2, 3), "whole": (0, 3), "partial": (0, 2)}
# ADR-0020's topology of the real model: a split, the whole, and a partial head.
SMOLLM2_LAYOUTS = {"head": (0, 14), "tail": (15, 29), "whole": (0, 29), "partial": (0, 21)}


def start_node(
    tmp: Path,
    model: str,
    layers: tuple[int, int],
    *,
    node_id: str,
    extra_args: list[str] | None = None,
) -> NodeProcess:
    """``python -m nodes_app.runtime`` (no tracker) serving as ``node_id``, one torch thread.

    Dev-open: tests call it directly, with unsigned plans (the signed-plan checks are
    tested in tests/nodes/runtime/hop/test_signed_plans_processes.py).
    """
    return start_localnet_node(
        name=node_id,
        model=model,
        layers=layers,
        env=process_env(),
        log_dir=tmp,
        node_id=node_id,
        dev_open=True,
        extra=extra_args or (),
    )


def runnode(
    tmp: Path, tracker: Tracker, layers: tuple[int, int], *extra: str, model: str = TINY
) -> NodeProcess:
    """``manage.py runnode`` joining ``tracker``, its wallet in ``tmp``; not waited for."""
    port = free_port()
    return start_localnet_node(
        name=str(port),
        model=model,
        layers=layers,
        env=process_env(),
        log_dir=tmp,
        port=port,
        tracker=tracker.url,
        wallet_key=tmp / f"wallet-{port}.key",
        extra=extra,
    )


@contextlib.contextmanager
def running_nodes(
    tmp: Path,
    model: str,
    layouts: dict[str, tuple[int, int]],
    *,
    prefix: str,
    timeout: float,
    extra_args: dict[str, list[str]] | None = None,
) -> Iterator[dict[str, NodeProcess]]:
    """Start one node per named layer range, wait until all serve, stop them all after.

    ``extra_args`` adds command-line options to the nodes it names.
    """
    nodes: dict[str, NodeProcess] = {}
    extra = extra_args or {}
    try:
        for name, layers in layouts.items():
            nodes[name] = start_node(
                tmp, model, layers, node_id=f"{prefix}-{name}", extra_args=extra.get(name)
            )
        for node in nodes.values():
            node.wait_serving(timeout=timeout)
        yield nodes
    finally:
        stop_together(node.process for node in nodes.values())


def generate_body(
    nodes_and_ranges: list[tuple[NodeProcess, int, int]],
    *,
    model: str = TINY,
    content: str = "Hello there",
    prompt: str | None = None,
    max_tokens: int = 16,
    **extra: Any,
) -> dict[str, Any]:
    """A greedy ``/v1/generate`` body whose plan runs each node over its given layers.

    A user message of ``content``, or with ``prompt`` a raw text prompt (no chat template).
    """
    text: dict[str, Any] = (
        {"messages": [{"role": "user", "content": content}]}
        if prompt is None
        else {"prompt": prompt}
    )
    return {
        "request_id": f"req-{time.monotonic_ns()}",
        **text,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "plan": {
            "model": model,
            "hops": [node.hop(start, end) for node, start, end in nodes_and_ranges],
        },
        **extra,
    }


def split_frames(nodes: dict[str, NodeProcess], **fields: Any) -> list[Any]:
    """A generation's frames on the split route of ``nodes`` (``head`` 0-1, ``tail`` 2-3)."""
    head, tail = nodes["head"], nodes["tail"]
    return read_stream(head.endpoint, generate_body([(head, 0, 1), (tail, 2, 3)], **fields))


def one_node_frames(nodes: dict[str, NodeProcess], **fields: Any) -> list[Any]:
    """A generation's frames on the one-node route of ``nodes`` (``whole`` 0-3: the head
    is the tail)."""
    whole = nodes["whole"]
    return read_stream(whole.endpoint, generate_body([(whole, 0, 3)], **fields))


def read_stream(endpoint: str, body: dict[str, Any], timeout: float = 120.0) -> list[Any]:
    """Every SSE ``data:`` payload of a ``/v1/generate`` call, parsed ("[DONE]" kept as is)."""
    return read_sse(f"{endpoint}/v1/generate", body, timeout=timeout)
