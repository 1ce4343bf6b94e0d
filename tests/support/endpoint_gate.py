"""An endpoint gate for in-process tests: no DNS, no connection."""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable

from nodes_app.endpoints import EndpointGate, EndpointUnproven


def isolated_gate(
    *,
    unproven: Iterable[str] = (),
    networks: Iterable[str] = ("0.0.0.0/0", "::/0"),
    resolves_to: str | None = None,
) -> EndpointGate:
    """An endpoint gate for in-process tests: no DNS, no connection.

    Every host name resolves to ``resolves_to``, by default to an address of
    10.0.0.0/8 of its own (endpoints are compared by address, so two names
    are two nodes only if they reach two addresses); every endpoint proves itself
    except those in ``unproven`` (canonical forms); ``networks`` are allowed
    (default: all, so only the always-refused addresses are refused).
    """
    failing = set(unproven)

    def prover(*, endpoint: str, wallet: str) -> None:
        if endpoint in failing:
            raise EndpointUnproven(f"Endpoint {endpoint} did not prove itself (test)")

    return EndpointGate(
        networks=tuple(ipaddress.ip_network(network) for network in networks),
        prover=prover,
        resolve=lambda host, port: [resolves_to or _address_of(host)],
    )


def _address_of(host: str) -> str:
    """A stable address of 10.0.0.0/8 for ``host`` (different names, different ones)."""
    digest = hashlib.sha256(host.encode()).digest()
    return str(ipaddress.IPv4Address(bytes([10, *digest[:3]])))
