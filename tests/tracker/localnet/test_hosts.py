"""A network across hosts: nodes in network namespaces of their own, each at its own 10.x address.

The test makes three hosts (namespaces ``a``, ``b``, ``c`` on a bridge, see
tests/support/netns.py): a head (layers 0-1) on ``a`` and a tail (2-3) on
each of ``b`` and ``c``, every node listening on port 7000 of its own host
and advertising ``http://10.x.y.N:7000``. Inside a namespace 127.0.0.1 is
the host's own: a node reaches the tracker, and the tracker and the other
nodes reach it, only across the bridge.

The tracker runs in the root namespace, bound to the bridge's address (not
loopback), because CI's PostgreSQL and Redis listen on 127.0.0.1 there: a
tracker in a namespace of its own would have to trade them for SQLite and a
private Redis, and the tests of this project run the tracker over the real
services. What crosses hosts is what runs between machines in production:
registration and heartbeats (node → tracker), the endpoint proof (tracker →
node), the chat (tracker → head) and the hop link (head → tail).

It needs root and ``ip``: without them every test here fails saying so
(CI runs as root). One set of hosts serves the whole module; the last test
kills a node.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.netns import Host, Hosts, hosts, start_node_on
from tests.support.network import Network
from tests.support.redis_db import private_redis
from tests.support.sse import chunks_of, text_of
from tracker_app.localnet import NodeProcess, fresh_process_database, stop_together

TINY = "tiny-random-llama"
PORT = 7000
PROMPT = [{"role": "user", "content": "Tell me about the hills."}]
# Long enough that a node killed at the first token dies mid-answer.
MAX_TOKENS = 200
# Where each node runs, and its layers.
PLACES = {"head": ("a", (0, 1)), "tail-b": ("b", (2, 3)), "tail-c": ("c", (2, 3))}
SETTINGS = {"MESHNET_RATE_LIMIT_PER_MINUTE": "1000", "MESHNET_ROUTE_MIN_SAMPLE_TOKENS": "1"}


@dataclass
class HostNetwork:
    """The tracker's network, its hosts, and its nodes by name."""

    net: Network
    hosts: Hosts
    nodes: dict[str, NodeProcess]
    workdir: Path

    def node_by_id(self, node_id: str) -> NodeProcess:
        return next(node for node in self.nodes.values() if node.node_id == node_id)

    def host_of(self, node: NodeProcess) -> Host:
        return self.hosts[PLACES[node.name][0]]


@pytest.fixture(scope="module")
def across(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[HostNetwork]:
    """Three hosts, a tracker on their bridge (a Redis database of its own) and three nodes.

    Everything is stopped and the hosts removed after, however the tests ended.
    """
    tmp = tmp_path_factory.mktemp("hosts")
    with hosts("a", "b", "c") as machines, fresh_process_database() as database_url:
        env = {
            **SETTINGS,
            "REDIS_URL": private_redis(redis_url),
            # Nodes call the tracker at the bridge's address: it must accept that Host header.
            "DJANGO_ALLOWED_HOSTS": f"{machines.gateway},127.0.0.1,localhost",
        }
        network = Network.throwaway(workdir=tmp, database_url=database_url, env=env)
        network.host = machines.gateway
        with network as net:
            net.api_key = net.create_api_key("hosts")
            net.start_tracker()
            nodes = {
                name: start_on(net, machines[place], name, layers, tmp)
                for name, (place, layers) in PLACES.items()
            }
            try:
                for node in nodes.values():
                    node.wait_serving(timeout=180)
                net.wait_for_route(TINY)
                yield HostNetwork(net, machines, nodes, tmp)
            finally:
                stop_together(node.process for node in nodes.values())


def start_on(
    net: Network,
    host: Host,
    name: str,
    layers: tuple[int, int],
    workdir: Path,
    *,
    port: int = PORT,
    advertise: str | None = None,
) -> NodeProcess:
    return start_node_on(
        host, name, model=TINY, layers=layers, port=port, tracker=net.url, env=net.env,
        workdir=workdir, advertise=advertise,
    )  # fmt: skip


def greedy_chat(net: Network) -> dict[str, Any]:
    response = net.chat(model=TINY, messages=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_nodes_on_other_hosts_are_online_at_their_own_addresses_after_proving_them(
    across: HostNetwork,
) -> None:
    rows = across.net.query("SELECT id, endpoint, status FROM nodes_app_node")

    expected = {
        node.node_id: (f"http://{across.host_of(node).address}:{PORT}", "online")
        for node in across.nodes.values()
    }
    assert {node_id: (endpoint, status) for node_id, endpoint, status in rows} == expected
    assert across.net.url.startswith(f"http://{across.hosts.gateway}:")


def test_a_node_advertising_an_address_it_does_not_serve_at_is_refused(
    across: HostNetwork,
) -> None:
    """A node on host ``a`` port 7001 claims host ``c``'s port 7001, where nothing listens:
    the tracker's challenge there gets no answer from its wallet, so it never registers."""
    elsewhere = f"http://{across.hosts['c'].address}:{PORT + 1}"
    impostor = start_on(
        across.net, across.hosts["a"], "impostor", (0, 3), across.workdir,
        port=PORT + 1, advertise=elsewhere,
    )  # fmt: skip
    with impostor.process:
        status = impostor.process.wait(timeout=180)

    assert status != 0
    assert "(endpoint_unproven)" in impostor.output()
    endpoints = [row[0] for row in across.net.query("SELECT endpoint FROM nodes_app_node")]
    assert elsewhere not in endpoints


def test_a_chat_runs_on_a_two_hop_route_across_hosts(across: HostNetwork) -> None:
    answer = greedy_chat(across.net)

    hops = answer["meshnet"]["hops"]
    route = [across.node_by_id(hop["node_id"]) for hop in hops]
    assert [node.name for node in route] in (["head", "tail-b"], ["head", "tail-c"])
    assert [across.host_of(node).name for node in route] in (["a", "b"], ["a", "c"])
    assert answer["usage"]["completion_tokens"] == MAX_TOKENS
    assert answer["choices"][0]["message"]["content"]


def test_when_a_hosts_node_dies_mid_answer_the_replica_on_another_host_finishes_it(
    across: HostNetwork,
) -> None:
    """The tail serving a stream is killed (SIGKILL, in its namespace) at the first token:
    the stream goes on through the other host's tail, to the same greedy answer."""
    whole = greedy_chat(across.net)["choices"][0]["message"]["content"]

    frames: list[Any] = []
    killed: NodeProcess | None = None
    for frame in across.net.iter_stream(
        model=TINY, messages=PROMPT, max_tokens=MAX_TOKENS, temperature=0
    ):
        frames.append(frame)
        if killed is None and any(
            c["choices"][0]["delta"].get("content") for c in chunks_of(frames)
        ):
            tail_id = chunks_of(frames)[0]["meshnet"]["hops"][1]["node_id"]
            killed = across.node_by_id(tail_id)
            killed.kill()
    after = greedy_chat(across.net)

    assert killed is not None, "the stream ended before any content"
    assert frames[-1] == "[DONE]"
    assert not [f for f in frames if isinstance(f, dict) and "error" in f]
    assert text_of(frames) == whole
    replica = across.node_by_id(after["meshnet"]["hops"][1]["node_id"])
    assert replica is not killed
    assert across.host_of(replica) != across.host_of(killed)
    assert after["choices"][0]["message"]["content"] == whole
