"""The network ``meshnet_up`` starts: tracker address and nodes, from a JSON file or the default.

A later change replaces these JSON files with TOML topologies under ``topologies/``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_TOPOLOGY: dict[str, Any] = {
    "tracker": {"host": "127.0.0.1", "port": 8000},
    "nodes": [
        {"model": "smollm2-135m", "layers": "0-14", "port": 7001, "threads": 1},
        {"model": "smollm2-135m", "layers": "15-29", "port": 7002, "threads": 1},
    ],
}


class TopologyError(ValueError):
    """The topology file cannot be read or does not describe a network."""


@dataclass(frozen=True)
class NodeSpec:
    model: str
    layers: str
    port: int
    threads: int = 1
    device: str = "cpu"

    @property
    def layer_range(self) -> tuple[int, int]:
        """``layers`` ("A-B") as (A, B)."""
        first, _, last = self.layers.partition("-")
        return int(first), int(last)


@dataclass(frozen=True)
class Topology:
    host: str
    port: int
    nodes: list[NodeSpec] = field(default_factory=list)

    @property
    def tracker_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def topology_load(path: Path | None) -> Topology:
    """Parse a topology JSON file (the default demo topology when ``path`` is None).

    Raises TopologyError naming what is wrong.
    """
    raw: Any = DEFAULT_TOPOLOGY
    if path is not None:
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise TopologyError(f"cannot read topology {path}: {exc}") from None
    try:
        tracker = raw.get("tracker", {})
        nodes = [NodeSpec(**node) for node in raw.get("nodes", [])]
        for node in nodes:
            start, end = node.layer_range
            if end < start:
                raise ValueError(f"layers {node.layers}: the end is before the start")
        return Topology(
            host=str(tracker.get("host", "127.0.0.1")),
            port=int(tracker.get("port", 8000)),
            nodes=nodes,
        )
    except (AttributeError, TypeError, ValueError) as exc:
        raise TopologyError(f"topology is malformed: {exc}") from None
