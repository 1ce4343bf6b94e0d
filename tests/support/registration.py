"""Build signed registrations the way a node does."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from nodes_app.endpoints import EndpointGate, EndpointUnproven
from nodes_app.signing import sign_registration, wallet_of
from tests.support.challenge import ChallengeResponder


def signed_registration(
    key: Ed25519PrivateKey | None = None, *, timestamp: float | None = None, **overrides: Any
) -> dict[str, Any]:
    """A registration body for the tiny model, signed by ``key`` (a new wallet by default)."""
    key = key or Ed25519PrivateKey.generate()
    fields: dict[str, Any] = {
        "wallet": wallet_of(key),
        "endpoint": "http://127.0.0.1:7001",
        "model": "tiny-random-llama",
        "shard_start": 0,
        "shard_end": 3,
        "num_layers": 4,
        "hardware": "cpu",
        "device_name": "test cpu",
        "benchmark_tps": 25.0,
        "timestamp": time.time() if timestamp is None else timestamp,
    }
    fields.update(overrides)
    return {**fields, "signature": sign_registration(key, fields)}


def proven_registration(
    responder: ChallengeResponder, key: Ed25519PrivateKey | None = None, **overrides: Any
) -> dict[str, Any]:
    """``signed_registration`` at an endpoint of ``responder`` that proves ``key``'s wallet.

    The same key always gets the same endpoint (a restart, a shard change);
    ``endpoint=`` overrides it.
    """
    key = key or Ed25519PrivateKey.generate()
    overrides.setdefault("endpoint", responder.endpoint_for(key))
    return signed_registration(key, **overrides)


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
