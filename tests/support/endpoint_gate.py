"""An endpoint gate for in-process tests: no DNS, no connection."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from nodes_app.endpoints import EndpointGate, EndpointUnproven


def isolated_gate(
    *,
    unproven: Iterable[str] = (),
    networks: Iterable[str] = ("0.0.0.0/0", "::/0"),
    resolves_to: str = "10.0.0.1",
) -> EndpointGate:
    """An endpoint gate for in-process tests: no DNS, no connection.

    Every host name resolves to ``resolves_to``; every endpoint proves itself
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
        resolve=lambda host, port: [resolves_to],
    )
