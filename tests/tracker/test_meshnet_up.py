"""`meshnet_up` (what `make demo` runs) starts a network, says where it is, stops it all."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import httpx
import pytest

from tracker_app.localnet import (
    ManagedProcess,
    TopologyError,
    free_port,
    manage_argv,
    process_env,
    topology_load,
)


def test_a_malformed_topology_is_refused_with_its_reason(tmp_path: Path) -> None:
    path = tmp_path / "topology.json"
    path.write_text(json.dumps({"nodes": [{"model": "x", "layerz": "0-1"}]}))

    with pytest.raises(TopologyError, match="malformed"):
        topology_load(path)


def test_the_default_topology_is_two_smollm2_halves() -> None:
    topology = topology_load(None)

    assert [(n.model, n.layers) for n in topology.nodes] == [
        ("smollm2-135m", "0-14"),
        ("smollm2-135m", "15-29"),
    ]


def test_it_starts_tracker_and_worker_prints_where_and_stops_on_ctrl_c(
    process_database_url: str, tmp_path: Path
) -> None:
    port = free_port()
    topology = tmp_path / "topology.json"
    topology.write_text(json.dumps({"tracker": {"host": "127.0.0.1", "port": port}, "nodes": []}))
    up = ManagedProcess(
        "meshnet_up",
        manage_argv("meshnet_up", "--topology", str(topology)),
        env=process_env(process_database_url),
        log_path=tmp_path / "up.log",
    )
    try:
        deadline = time.monotonic() + 90
        while "Meshnet is up." not in up.output():
            assert up.alive(), up.output()
            assert time.monotonic() < deadline, up.output()
            time.sleep(0.3)
        out = up.output()
        assert f"Meshnet is up. Dashboard: http://127.0.0.1:{port}/dashboard/" in out
        assert f"http://127.0.0.1:{port}/admin/" in out
        assert "started tracker" in out and "started worker" in out
        key_line = next(line for line in out.splitlines() if "API key:" in line)
        assert key_line.split()[-1].startswith("mk-")
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200

        up.signal(signal.SIGINT)
        assert up.wait(timeout=40) == 0, up.output()
    finally:
        up.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/healthz")
