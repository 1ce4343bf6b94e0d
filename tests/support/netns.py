"""Hosts of a test's own on one machine: network namespaces on a bridge, each with a 10.x address.

:func:`hosts` creates a bridge in the root namespace (its address is the
root namespace's own on that network) and one namespace per host, each
joined to the bridge by a veth pair and given the next address. A process
started in a host (:meth:`Host.argv`) has its own loopback and sees the
others only at their addresses on the bridge. Names and the /24 are chosen
at random and checked free, so parallel runs do not collide; everything is
removed on the way out, whatever happened.

It needs root and ``ip`` (iproute2): without them :class:`HostsUnavailable`
says so. CI runs as root.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tracker_app.localnet import ManagedProcess, NodeProcess, node_argv


class HostsUnavailable(RuntimeError):
    """This machine cannot make network namespaces (not root, or no ``ip``)."""


@dataclass(frozen=True)
class Host:
    """A network namespace ``namespace`` reached at ``address`` on the hosts' bridge."""

    name: str
    namespace: str
    address: str

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host (``ip netns exec`` execs it: same process id)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


@dataclass(frozen=True)
class Hosts:
    """The hosts by name, and ``gateway``: the root namespace's address on their bridge."""

    gateway: str
    by_name: dict[str, Host]

    def __getitem__(self, name: str) -> Host:
        return self.by_name[name]


def check_available() -> None:
    """Raise :class:`HostsUnavailable`, saying why, unless this process can make hosts."""
    if os.geteuid() != 0:
        raise HostsUnavailable(
            "the multi-host tests make network namespaces and need root (CI runs them as root)"
        )
    if shutil.which("ip") is None:
        raise HostsUnavailable("the multi-host tests need `ip` (iproute2) to make namespaces")


@contextlib.contextmanager
def hosts(*names: str) -> Iterator[Hosts]:
    """A bridge and one namespace per name on a free 10.x.y.0/24; all removed after."""
    check_available()
    tag = uuid.uuid4().hex[:6]
    network = _free_network()
    addresses = network.hosts()
    gateway = str(next(addresses))
    bridge = f"mnbr{tag}"
    made: list[list[str]] = []  # the commands that undo what was made, newest last
    try:
        _ip("link", "add", bridge, "type", "bridge")
        made.append(["link", "del", bridge])
        _ip("addr", "add", f"{gateway}/{network.prefixlen}", "dev", bridge)
        _ip("link", "set", bridge, "up")
        by_name: dict[str, Host] = {}
        for index, name in enumerate(names):
            namespace, outside, inside = f"mn{tag}-{name}", f"mnv{tag}{index}", f"mni{tag}{index}"
            address = str(next(addresses))
            _ip("netns", "add", namespace)
            made.append(["netns", "del", namespace])
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            made.append(["link", "del", outside])  # gone with the namespace, else here
            _ip("link", "set", inside, "netns", namespace)
            _ip("link", "set", outside, "master", bridge)
            _ip("link", "set", outside, "up")
            _ip("-n", namespace, "addr", "add", f"{address}/{network.prefixlen}", "dev", inside)
            _ip("-n", namespace, "link", "set", inside, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            by_name[name] = Host(name, namespace, address)
        yield Hosts(gateway, by_name)
    finally:
        for undo in reversed(made):
            subprocess.run(["ip", *undo], capture_output=True, check=False)


def start_node_on(
    host: Host,
    name: str,
    *,
    model: str,
    layers: tuple[int, int],
    port: int,
    tracker: str,
    env: dict[str, str],
    workdir: Path,
    advertise: str | None = None,
) -> NodeProcess:
    """``runnode`` inside ``host``, listening on every address of its own and advertising
    ``advertise`` (default: ``http://ADDRESS:PORT``, the host's address); not waited for.

    Each host has ports of its own, so nodes on several hosts may all use one port.
    Its wallet is ``workdir/wallets/wallet-NAME.key``, its log ``workdir/node-NAME.log``.
    """
    endpoint = advertise or f"http://{host.address}:{port}"
    argv = node_argv(
        model=model, layers=layers, port=port, tracker=tracker, host="0.0.0.0",
        wallet_key=workdir / "wallets" / f"wallet-{name}.key", extra=("--advertise", endpoint),
    )  # fmt: skip
    process = ManagedProcess(
        f"node-{name}", host.argv(argv), env=env, log_path=workdir / f"node-{name}.log"
    )
    return NodeProcess(name, model, layers, endpoint, process)


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise HostsUnavailable(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


def _free_network() -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 that no address of the root namespace lies in."""
    listed = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    used = [
        ipaddress.ip_interface(field).network
        for line in listed.splitlines()
        for field in line.split()[3:4]
    ]
    while True:
        network = ipaddress.IPv4Network(
            f"10.{random.randint(100, 254)}.{random.randint(0, 255)}.0/24"
        )
        if not any(network.overlaps(other) for other in used):
            return network
