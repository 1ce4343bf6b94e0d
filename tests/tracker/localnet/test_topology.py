"""Topology files (``topologies/*.toml``): what ``meshnet_up`` starts, and the errors it gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from routing_app.planning.route_plan import NodeRecord
from routing_app.planning.search import enumerate_routes
from tracker_app.localnet.topology import TopologyError, topology_load


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "net.toml"
    path.write_text(text)
    return path


def _candidates(name: str) -> list[str]:
    """The planner's candidate routes for the shipped topology ``name`` (one model)."""
    topology = topology_load(name)
    (model,) = topology.models
    nodes = [
        NodeRecord(node.name, f"http://x:{node.port}", *node.layers, benchmark_tps=10.0)
        for node in topology.nodes
    ]
    num_layers = max(node.layers[1] for node in topology.nodes) + 1
    plans = enumerate_routes(model_key=model, num_layers=num_layers, nodes=nodes)
    return sorted(" -> ".join(hop.label for hop in plan.hops) for plan in plans)


def _route_shapes(candidates: list[str]) -> list[str]:
    """The candidates by node names only (``head -> tail``), layers left out."""
    return sorted(
        " -> ".join(hop.split("[")[0] for hop in route.split(" -> ")) for route in candidates
    )


def test_the_default_is_adr_0020s_mixed_smollm2_topology_with_every_node_on_a_candidate() -> None:
    topology = topology_load(None)
    candidates = _candidates("mixed")

    assert topology.source.endswith("topologies/mixed.toml")
    assert [(n.model, n.layers) for n in topology.nodes] == [
        ("smollm2-135m", (0, 21)),
        ("smollm2-135m", (0, 29)),
        ("smollm2-135m", (0, 14)),
        ("smollm2-135m", (15, 29)),
    ]
    # ADR-0020's question (the full node, or a head plus a hop?) is asked of the tail too.
    assert "full[0-29]" in candidates
    assert "head[0-14] -> tail[15-29]" in candidates
    assert "partial-head[0-21] -> tail[22-29]" in candidates
    on_routes = {hop.split("[")[0] for route in candidates for hop in route.split(" -> ")}
    assert on_routes == {node.name for node in topology.nodes}


def test_split_is_two_smollm2_halves_with_one_route() -> None:
    assert _candidates("split") == ["head[0-14] -> tail[15-29]"]


def test_tiny_runs_the_built_in_model_in_the_same_route_shape() -> None:
    topology = topology_load("tiny")

    assert topology.models == ["tiny-random-llama"]
    assert "head[0-1] -> tail[2-3]" in _candidates("tiny")
    assert _route_shapes(_candidates("tiny")) == _route_shapes(_candidates("mixed"))


def test_a_path_is_read_as_well_as_a_shipped_name(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '[tracker]\nport = 9100\n[[nodes]]\nmodel = "tiny-random-llama"\nlayers = "0-3"\n'
        "port = 9101\n",
    )

    topology = topology_load(path)

    assert topology.tracker_url == "http://127.0.0.1:9100"
    assert topology.nodes[0].name == "9101" and topology.nodes[0].threads == 1


def test_port_base_moves_the_tracker_and_then_each_node_in_order() -> None:
    topology = topology_load("tiny").with_port_base(20000)

    assert topology.port == 20000
    assert [n.port for n in topology.nodes] == [20001, 20002, 20003, 20004]


def test_an_unknown_name_lists_the_shipped_topologies() -> None:
    with pytest.raises(TopologyError, match="shipped topologies: mixed, split, tiny"):
        topology_load("nope")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[tracker\n", r"not valid TOML.*line 1"),
        (
            '[[nodes]]\nmodel = "tiny-random-llama"\nlayerz = "0-3"\nport = 1',
            r"nodes\[0\]: unknown field 'layerz'",
        ),
        ('[[nodes]]\nmodel = "tiny-random-llama"\nport = 1', r"nodes\[0\].layers: is missing"),
        (
            '[[nodes]]\nmodel = "gpt-9"\nlayers = "0-3"\nport = 1',
            r"nodes\[0\].model: 'gpt-9' is not in the catalogue",
        ),
        (
            '[[nodes]]\nmodel = "tiny-random-llama"\nlayers = "0..3"\nport = 1',
            r'nodes\[0\].layers: .* is not "A-B"',
        ),
        (
            '[[nodes]]\nmodel = "tiny-random-llama"\nlayers = "0-4"\nport = 1',
            r"past tiny-random-llama's last layer 3",
        ),
        (
            '[[nodes]]\nmodel = "tiny-random-llama"\nlayers = "3-1"\nport = 1',
            r"last layer comes before the first",
        ),
        (
            '[[nodes]]\nmodel = "tiny-random-llama"\nlayers = "0-3"\nport = "x"',
            r"nodes\[0\].port: must be a TCP port",
        ),
        (
            '[tracker]\nport = 1\n[[nodes]]\nmodel = "tiny-random-llama"\nlayers = "0-3"\nport = 1',
            r"nodes\[0\].port: 1 is already used by tracker.port",
        ),
        (
            '[[nodes]]\nmodel = "tiny-random-llama"\nlayers = "0-1"\nport = 1',
            r"no complete route.*reaches layer 3",
        ),
        (
            '[[nodes]]\nmodel = "tiny-random-llama"\nlayers = "0-3"\nport = 1\nthreads = 0',
            r"nodes\[0\].threads",
        ),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_field(
    tmp_path: Path, text: str, message: str
) -> None:
    path = _write(tmp_path, text)

    with pytest.raises(TopologyError, match=message) as caught:
        topology_load(path)
    assert str(path) in str(caught.value)
