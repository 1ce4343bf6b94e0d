"""The demo ``meshnet_up`` runs: a whole network from a topology, warmed up, then a ready block.

The steps, each a function the command calls in order: take the lock (a
second demo says who runs instead of failing on a busy port), load or keep
the demo's credentials (created once, stored in ``demo.json`` under the
state folder, mode 0600), start the tracker, the worker with beat and the
topology's nodes, report each node as it finishes loading, wait until every
model has a complete route, send one warm-up request down each candidate
route (pinned with the request's ``route`` field), and print the ready block.
Nothing here imports Django: the command creates the user and the key.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from tracker_app.localnet.network import LocalNetwork, NodeProcess
from tracker_app.localnet.topology import Topology

CREDENTIALS_FILE = "demo.json"
LOCK_FILE = "meshnet_up.pid"
READY_HEADLINE = "Meshnet is up."
NODE_LOAD_TIMEOUT = 600.0  # SmolLM2 on a slow CPU, first run (unpacking the weights)

Say = Callable[[str], None]


class DemoAlreadyRunning(RuntimeError):
    """Another ``meshnet_up`` holds the lock (its pid is alive), or the tracker's port is busy."""


@dataclass(frozen=True)
class DemoCredentials:
    """The demo's dashboard login and client API key, as stored in ``demo.json``."""

    username: str
    password: str
    api_key: str


def credentials_load(var_dir: Path) -> DemoCredentials | None:
    """The stored credentials, or None when there are none (or the file is unreadable)."""
    try:
        raw = json.loads((var_dir / CREDENTIALS_FILE).read_text())
        return DemoCredentials(
            username=str(raw["username"]),
            password=str(raw["password"]),
            api_key=str(raw["api_key"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def credentials_save(var_dir: Path, credentials: DemoCredentials) -> Path:
    """Store ``credentials`` in ``demo.json``, readable by this user only; returns the path."""
    var_dir.mkdir(parents=True, exist_ok=True)
    path = var_dir / CREDENTIALS_FILE
    # Created 0600 from the start: the key is never readable by others, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump(asdict(credentials), file, indent=2)
    os.chmod(path, 0o600)
    return path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


@contextlib.contextmanager
def demo_lock(var_dir: Path) -> Iterator[Path]:
    """Hold ``meshnet_up.pid`` under ``var_dir`` while the demo runs.

    Raises DemoAlreadyRunning when the file names a live process; a file
    left by a process that died (a SIGKILL, a crash) is taken over. The file
    is removed on the way out if it still holds this process's pid.
    """
    var_dir.mkdir(parents=True, exist_ok=True)
    path = var_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        try:
            holder = int(path.read_text().strip() or 0)
        except (OSError, ValueError):
            holder = 0
        if holder and holder != os.getpid() and _pid_alive(holder):
            raise DemoAlreadyRunning(
                f"meshnet_up is already running (pid {holder}, lock {path}); stop it with "
                f"Ctrl-C in its terminal or `kill {holder}`, then run it again"
            ) from None
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w") as file:
        file.write(f"{os.getpid()}\n")
    try:
        yield path
    finally:
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text().strip()) == os.getpid():
                path.unlink()


def check_ports_free(topology: Topology) -> None:
    """Raise DemoAlreadyRunning naming the first of the topology's ports something listens on."""
    wanted = [("the tracker", topology.port)] + [
        (f"node {node.name}", node.port) for node in topology.nodes
    ]
    for what, port in wanted:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            busy = sock.connect_ex((topology.host, port)) == 0
        if busy:
            raise DemoAlreadyRunning(
                f"port {port} on {topology.host} (for {what}) is busy: something else listens "
                "there; stop it, or move the whole demo with `--port-base N`"
            )


def start_network(network: LocalNetwork, topology: Topology, *, say: Say) -> None:
    """Tracker (waited for), worker with beat, then every node (not waited for)."""
    network.start_tracker(port=topology.port)
    network.start_worker("--concurrency", "1")
    for node in topology.nodes:
        network.add_node(
            node.name, model=node.model, layers=node.layers, port=node.port,
            threads=node.threads, device=node.device, wait=False,
        )  # fmt: skip
    if topology.nodes:
        say(f"loading {len(topology.nodes)} node(s); each is reported as it starts serving…")


def wait_for_nodes(
    network: LocalNetwork, *, say: Say, timeout: float = NODE_LOAD_TIMEOUT, poll: float = 0.5
) -> None:
    """Report each node as it serves (``k/n``, with its load time); return once all do.

    Raises ProcessExited (naming the node's log) if a node ends, TimeoutError
    after ``timeout`` seconds.
    """
    started = time.monotonic()
    waiting: dict[str, NodeProcess] = dict(network.nodes)
    total = len(waiting)
    while waiting:
        for name, node in list(waiting.items()):
            node.process.check_alive()
            try:
                node.wait_serving(timeout=0)
            except TimeoutError:
                continue
            del waiting[name]
            say(
                f"  node {name} ({node.model} layers {node.layers[0]}-{node.layers[1]}) serves "
                f"at {node.endpoint} as {node.node_id} after {time.monotonic() - started:.0f} s "
                f"[{total - len(waiting)}/{total}]"
            )
        if waiting and time.monotonic() - started > timeout:
            names = ", ".join(waiting)
            raise TimeoutError(f"nodes {names} did not serve within {timeout:.0f} s")
        if waiting:
            time.sleep(poll)


def wait_for_routes(network: LocalNetwork, topology: Topology, *, say: Say) -> None:
    """Wait until the tracker lists every model of the topology (a complete route exists)."""
    for model in topology.models:
        network.wait_for_route(model, timeout=120)
        say(f"  {model}: a complete route is ready")


def candidate_routes(tracker_url: str, model: str, api_key: str) -> list[list[str]]:
    """The node ids of each candidate route the tracker lists for ``model`` in ``/v1/routing``."""
    table = httpx.get(
        f"{tracker_url}/v1/routing",
        params={"model": model},
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=10,
    ).json()
    routes: list[list[str]] = []
    for entry in table.get("models", []):
        if entry.get("model") == model:
            routes += [[hop["node_id"] for hop in route["hops"]] for route in entry["routes"]]
    return routes


def warm_up(network: LocalNetwork, topology: Topology, api_key: str, *, say: Say) -> int:
    """One short chat down each candidate route of each model; the number of routes warmed.

    A route that fails is reported, not fatal: the demo still starts, and the
    routing panel shows the route's trouble.
    """
    tracker_url = network.url
    names = {node.node_id: name for name, node in network.nodes.items()}
    warmed = 0
    with httpx.Client(
        base_url=tracker_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=120
    ) as client:
        for model in topology.models:
            for route in candidate_routes(tracker_url, model, api_key):
                label = " -> ".join(names.get(node_id, node_id) for node_id in route)
                started = time.monotonic()
                reply = client.post(
                    "/v1/chat/completions",
                    json={
                        "model": model,
                        "messages": [{"role": "user", "content": "Say hello."}],
                        "max_tokens": 8,
                        "route": route,
                    },
                )
                if reply.status_code != 200:
                    say(
                        f"  warm-up {model} via {label}: HTTP {reply.status_code} "
                        f"{reply.text[:200]}"
                    )
                    continue
                tokens = reply.json().get("usage", {}).get("completion_tokens", 0)
                say(
                    f"  warm-up {model} via {label}: {tokens} tokens in "
                    f"{time.monotonic() - started:.1f} s"
                )
                warmed += 1
    return warmed


def ready_block(
    tracker_url: str,
    topology: Topology,
    credentials: DemoCredentials,
    *,
    password_shown: bool,
    credentials_path: Path,
) -> str:
    """The block printed once everything serves: dashboard and login first, then the API."""
    model = topology.models[0] if topology.models else "MODEL"
    password = (
        credentials.password
        if password_shown
        else f"(as printed on the first run; stored in {credentials_path})"
    )
    chat = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}]})
    return "\n".join(
        [
            "",
            f"{READY_HEADLINE} Dashboard: {tracker_url}/dashboard/",
            f"  login:     {credentials.username} / {password}",
            f"  API key:   {credentials.api_key}",
            f"  admin:     {tracker_url}/admin/    routing: {tracker_url}/v1/routing "
            "(signed in as staff, or with the API key)",
            "",
            "Chat from a shell:",
            f"  curl -sN {tracker_url}/v1/chat/completions -H 'Authorization: Bearer "
            f"{credentials.api_key}' -H 'Content-Type: application/json' -d '{chat}'",
            "",
            "Or from Python (pip install openai):",
            "  from openai import OpenAI",
            f'  client = OpenAI(base_url="{tracker_url}/v1", api_key="{credentials.api_key}")',
            f'  reply = client.chat.completions.create(model="{model}", '
            'messages=[{"role": "user", "content": "Hello!"}])',
            "  print(reply.choices[0].message.content)",
            "",
            "Press Ctrl-C to stop everything.",
            "",
        ]
    )


def run_until_stopped(network: LocalNetwork, *, poll: float = 1.0) -> None:
    """Watch the network until a signal ends this process; raises ProcessExited if a part dies."""
    while True:
        network.check_alive()
        time.sleep(poll)


__all__ = [
    "CREDENTIALS_FILE",
    "LOCK_FILE",
    "READY_HEADLINE",
    "DemoAlreadyRunning",
    "DemoCredentials",
    "candidate_routes",
    "check_ports_free",
    "credentials_load",
    "credentials_save",
    "demo_lock",
    "ready_block",
    "run_until_stopped",
    "start_network",
    "wait_for_nodes",
    "wait_for_routes",
    "warm_up",
]
