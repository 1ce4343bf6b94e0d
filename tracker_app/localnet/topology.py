"""The network ``meshnet_up`` starts, read from a TOML topology file under ``topologies/``.

A topology names the tracker's address and the nodes to start: each node's
model (a catalogue key), its layers (``"A-B"``, inclusive) and its port.
``topologies/mixed.toml`` (the default) is ADR-0020's topology with SmolLM2;
the comments at its top describe every field. This is the one parser of
topology files; it reads them with the standard library's ``tomllib`` and
refuses anything it does not understand with a :class:`TopologyError` that
names the file and the field.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from nodes_app.shared.catalogue import SHIPPED, catalogue_entry
from tracker_app.localnet.processes import ROOT

TOPOLOGIES_DIR = ROOT / "topologies"
DEFAULT_TOPOLOGY = "mixed"

_TOP_KEYS = {"tracker", "nodes"}
_TRACKER_KEYS = {"host", "port"}
_NODE_KEYS = {"name", "model", "layers", "port", "threads", "device"}

# Builds the error for a field (its dotted name) and what is wrong with it.
_Fail = Callable[[str, str], "TopologyError"]


class TopologyError(ValueError):
    """The topology cannot be read or does not describe a network; the message says where."""


@dataclass(frozen=True)
class NodeSpec:
    """One node to start: ``layers`` of ``model`` on ``port``.

    ``threads`` None leaves the count to torch.
    """

    name: str
    model: str
    layers: tuple[int, int]
    port: int
    threads: int | None = 1
    device: str = "cpu"


@dataclass(frozen=True)
class Topology:
    """A tracker address and the nodes to start, in the file's order."""

    host: str
    port: int
    nodes: list[NodeSpec] = field(default_factory=list)
    source: str = "<default>"

    @property
    def tracker_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def models(self) -> list[str]:
        """The models the nodes serve, each once, in the file's order."""
        return list(dict.fromkeys(node.model for node in self.nodes))

    def with_port_base(self, base: int) -> Topology:
        """The same network with the tracker on ``base`` and the nodes on ``base+1``, … ."""
        nodes = [replace(node, port=base + 1 + i) for i, node in enumerate(self.nodes)]
        return replace(self, port=base, nodes=nodes)


def topology_path(name_or_path: str | Path | None) -> Path:
    """The file a ``--topology`` value names.

    None is the default (``mixed``); a bare name such as ``tiny`` is
    ``topologies/tiny.toml``; anything else is a path. Raises TopologyError,
    listing the shipped names, when the file does not exist.
    """
    value = str(name_or_path or DEFAULT_TOPOLOGY)
    path = Path(value)
    if path.suffix != ".toml" and "/" not in value:
        path = TOPOLOGIES_DIR / f"{value}.toml"
    if not path.is_file():
        shipped = ", ".join(sorted(p.stem for p in TOPOLOGIES_DIR.glob("*.toml")))
        raise TopologyError(f"no topology file {path} (shipped topologies: {shipped})")
    return path


def topology_load(name_or_path: str | Path | None = None) -> Topology:
    """Read and validate the topology ``name_or_path`` names (see :func:`topology_path`).

    Raises TopologyError naming the file and the field: a TOML syntax error
    (with its line), an unknown or missing field, a wrong type, a model the
    catalogue does not ship, layers outside the model, two uses of one port,
    or a model whose nodes leave no complete route.
    """
    path = topology_path(name_or_path)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise TopologyError(f"cannot read topology {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(f"{path}: not valid TOML: {exc}") from None
    return topology_parse(raw, source=str(path))


def topology_parse(raw: dict[str, Any], *, source: str = "<topology>") -> Topology:
    """Validate a parsed TOML document as a topology (see :func:`topology_load`)."""

    def fail(where: str, message: str) -> TopologyError:
        return TopologyError(f"{source}: {where}: {message}")

    _refuse_unknown(raw, _TOP_KEYS, "top level", fail)
    tracker = raw.get("tracker", {})
    if not isinstance(tracker, dict):
        raise fail("tracker", "must be a table ([tracker])")
    _refuse_unknown(tracker, _TRACKER_KEYS, "tracker", fail)
    host = _typed(tracker, "host", str, "tracker.host", fail, default="127.0.0.1")
    port = _port(tracker, "tracker.port", fail, default=8000)
    raw_nodes = raw.get("nodes", [])
    if not isinstance(raw_nodes, list):
        raise fail("nodes", "must be an array of tables ([[nodes]])")
    nodes = [_node(entry, index, fail) for index, entry in enumerate(raw_nodes)]
    _check_ports(port, nodes, fail)
    _check_names(nodes, fail)
    for model in dict.fromkeys(node.model for node in nodes):
        _check_complete(model, [node for node in nodes if node.model == model], fail)
    return Topology(host=host, port=port, nodes=nodes, source=source)


def _node(entry: Any, index: int, fail: _Fail) -> NodeSpec:
    where = f"nodes[{index}]"
    if not isinstance(entry, dict):
        raise fail(where, "must be a table ([[nodes]])")
    _refuse_unknown(entry, _NODE_KEYS, where, fail)
    for required in ("model", "layers", "port"):
        if required not in entry:
            raise fail(f"{where}.{required}", "is missing")
    model = _typed(entry, "model", str, f"{where}.model", fail)
    spec = catalogue_entry(model)
    if spec is None:
        known = ", ".join(entry.key for entry in SHIPPED)
        raise fail(f"{where}.model", f"{model!r} is not in the catalogue (known: {known})")
    layers = _layers(entry, f"{where}.layers", spec.num_layers, model, fail)
    port = _port(entry, f"{where}.port", fail)
    threads = entry.get("threads", 1)
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise fail(f"{where}.threads", f"must be a whole number of at least 1, not {threads!r}")
    device = _typed(entry, "device", str, f"{where}.device", fail, default="cpu")
    name = _typed(entry, "name", str, f"{where}.name", fail, default=str(port))
    return NodeSpec(
        name=name, model=model, layers=layers, port=port, threads=threads, device=device
    )


def _layers(
    entry: dict[str, Any], where: str, num_layers: int, model: str, fail: _Fail
) -> tuple[int, int]:
    text = _typed(entry, "layers", str, where, fail)
    first, dash, last = text.partition("-")
    if not (dash and first.strip().isdigit() and last.strip().isdigit()):
        raise fail(where, f'{text!r} is not "A-B" (first and last layer, e.g. "0-14")')
    start, end = int(first), int(last)
    if end < start:
        raise fail(where, f"{text!r}: the last layer comes before the first")
    if end > num_layers - 1:
        raise fail(where, f"{text!r} goes past {model}'s last layer {num_layers - 1}")
    return start, end


def _port(entry: dict[str, Any], where: str, fail: _Fail, default: int | None = None) -> int:
    port = entry.get(where.rsplit(".", 1)[-1], default)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise fail(where, f"must be a TCP port number (1-65535), not {port!r}")
    return port


def _typed(
    entry: dict[str, Any], key: str, kind: type, where: str, fail: _Fail, default: Any = None
) -> Any:
    value = entry.get(key, default)
    if not isinstance(value, kind):
        raise fail(where, f"must be a {kind.__name__}, not {value!r}")
    return value


def _refuse_unknown(entry: dict[str, Any], known: set[str], where: str, fail: _Fail) -> None:
    unknown = sorted(set(entry) - known)
    if unknown:
        raise fail(where, f"unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})")


def _check_ports(tracker_port: int, nodes: list[NodeSpec], fail: _Fail) -> None:
    seen = {tracker_port: "tracker.port"}
    for index, node in enumerate(nodes):
        where = f"nodes[{index}].port"
        if node.port in seen:
            raise fail(where, f"{node.port} is already used by {seen[node.port]}")
        seen[node.port] = where


def _check_names(nodes: list[NodeSpec], fail: _Fail) -> None:
    seen: set[str] = set()
    for index, node in enumerate(nodes):
        if node.name in seen:
            raise fail(f"nodes[{index}].name", f"{node.name!r} names two nodes")
        seen.add(node.name)


def _check_complete(model: str, nodes: list[NodeSpec], fail: _Fail) -> None:
    """Some chain of the model's nodes runs every layer from 0 to the last."""
    spec = catalogue_entry(model)
    assert spec is not None  # the nodes were validated against the catalogue
    reach = -1  # the furthest layer a chain from layer 0 can run so far
    for start, end in sorted(node.layers for node in nodes):
        if start > reach + 1:
            break
        reach = max(reach, end)
    if reach < spec.num_layers - 1:
        raise fail(
            "nodes",
            f"{model}'s nodes leave no complete route: no chain from layer 0 reaches layer "
            f"{spec.num_layers - 1} (the furthest is {reach})",
        )
