"""Which node endpoints the tracker will talk to, and the proof that a wallet serves there.

Policy (``EndpointGate.admit``): an http(s) URL of a host and port, without a
path, whose host resolves to one address inside the allowed networks
(``MESHNET_NODE_NETWORKS``); link-local, unspecified, multicast, reserved and
cloud-metadata names and addresses are refused whatever the networks say,
before any connection is made.

Identity (``AdmittedEndpoint.identity``): the address and port a connection
reaches, every loopback address one, so that the bans and the one-wallet rule
compare the socket and not a spelling (``localhost`` for ``127.0.0.1``).

Proof (``EndpointGate.prove``): the tracker posts a fresh nonce to
``{endpoint}/v1/challenge`` and accepts only the registering wallet's
signature over it and the endpoint (``nodes_app.shared.signing``). No redirect is
followed, the answer is bounded, and no part of it ever reaches a client:
every failure is the same refusal, whatever the port did (closed, another
server, another wallet), so registrations cannot map ports; the operator's
log keeps the detail.

Django-free: the registry services and tasks take an ``EndpointGate``, so unit
tests pass one with an isolating prover and resolver (ADR-0008).
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from meshnet_site.environment import IPNetwork
from meshnet_site.errors import DomainError, ErrorKind
from nodes_app.protocol.decoding import json_document
from nodes_app.shared.signing import canonical_endpoint, verify_challenge

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

logger = logging.getLogger("meshnet.nodes")

# How long the tracker waits for a challenge answer, and the most it reads of one.
CHALLENGE_TIMEOUT = 5.0
MAX_CHALLENGE_ANSWER_BYTES = 4096

# Cloud instance-metadata services: never a node, whatever the networks allow.
METADATA_HOSTS = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.com",
        "metadata.internal",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(address)
    for address in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean…
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "168.63.129.16",  # Azure wire server
    )
)


class EndpointNotAllowed(DomainError):
    """The endpoint is not a URL the tracker may talk to (the message says why)."""

    kind = ErrorKind.INVALID
    code = "endpoint_not_allowed"


class EndpointUnproven(DomainError):
    """The endpoint did not prove that the registering wallet serves there."""

    kind = ErrorKind.FORBIDDEN
    code = "endpoint_unproven"


class EndpointProver(Protocol):
    """Proves that ``wallet`` serves at ``endpoint``; raises ``EndpointUnproven`` if not."""

    def __call__(self, *, endpoint: str, wallet: str) -> None: ...


Resolver = Callable[[str, int], Iterable[str]]


def resolve_host(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (the system resolver); [] when it does not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    return [str(info[4][0]) for info in infos]


def unmapped(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address (``::ffff:a.b.c.d``) as the IPv4 address it reaches."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def always_refused(address: IPAddress) -> bool:
    """Addresses no setting can allow: metadata, link-local, unspecified, multicast, and
    IPv4's "this network" (0.0.0.0/8, which Linux connects to itself) and 240.0.0.0/4."""
    address = unmapped(address)
    if address in METADATA_ADDRESSES or address.is_link_local:
        return True
    if address.is_unspecified or address.is_multicast:
        return True
    # IPv6's is_reserved covers ::/8 and with it ::1, which a setting may allow.
    return isinstance(address, ipaddress.IPv4Address) and (
        address.is_reserved or address in _THIS_NETWORK
    )


# 0.0.0.0/8 means "this host" to Linux: a connection to 0.1.2.3 may reach loopback.
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")


def http_challenge_prover(*, endpoint: str, wallet: str) -> None:
    """The real proof: POST a fresh nonce to the endpoint, verify ``wallet``'s signature.

    Short timeout, no redirects, no proxy from the environment, at most
    ``MAX_CHALLENGE_ANSWER_BYTES`` read. Raises ``EndpointUnproven``: one
    refusal for every failure, which says nothing of what the port did (see
    ``unproven``); the operator's log says what went wrong.
    """
    nonce = secrets.token_hex(32)
    url = f"{endpoint}/v1/challenge"
    try:
        with (
            httpx.Client(
                timeout=CHALLENGE_TIMEOUT, follow_redirects=False, trust_env=False
            ) as client,
            client.stream("POST", url, json={"nonce": nonce}) as response,
        ):
            if response.status_code != 200:
                raise unproven(
                    endpoint, f"it answered the challenge with HTTP {response.status_code}"
                )
            raw = b""
            for chunk in response.iter_bytes():
                raw += chunk
                if len(raw) > MAX_CHALLENGE_ANSWER_BYTES:
                    raise unproven(endpoint, "its answer to the challenge is too large")
    except httpx.HTTPError as error:
        raise unproven(
            endpoint, f"the challenge could not be delivered ({type(error).__name__})"
        ) from None
    try:
        answer = json_document(raw)
    except ValueError:
        raise unproven(endpoint, "its answer to the challenge is not JSON") from None
    signature = answer.get("signature") if isinstance(answer, dict) else None
    if not isinstance(signature, str) or not verify_challenge(wallet, nonce, endpoint, signature):
        raise unproven(endpoint, "its answer is not the registering wallet's signature")


def unproven(endpoint: str, why: str) -> EndpointUnproven:
    """The one refusal of a failed proof. ``why`` goes to the operator's log only: a
    registrant learning whether the port was closed, served something else or
    answered for another wallet could map the ports the tracker reaches."""
    logger.info("endpoint %s did not prove the registering wallet: %s", endpoint, why)
    return EndpointUnproven(
        f"Endpoint {endpoint} did not prove that the registering wallet serves there: "
        "its /v1/challenge must answer with this wallet's signature over the nonce and "
        "the endpoint as registered"
    )


@dataclass(frozen=True)
class AdmittedEndpoint:
    """An endpoint the policy allows: its canonical URL, and its identity — the address
    and port a connection to it reaches (``identity_of``), which is what bans and the
    one-wallet-per-endpoint rule compare."""

    url: str
    identity: str


def identity_of(address: IPAddress, port: int) -> str:
    """``address:port`` with every loopback address one host (``loopback:PORT``): a node
    listening on a wildcard answers on all of 127.0.0.0/8 and ::1, so those are
    spellings of one socket, not distinct endpoints."""
    address = unmapped(address)
    if address.is_loopback:
        return f"loopback:{port}"
    host = f"[{address}]" if address.version == 6 else str(address)
    return f"{host}:{port}"


@dataclass(frozen=True)
class EndpointGate:
    """What the registry asks of a node endpoint: the network policy, then the proof."""

    networks: tuple[IPNetwork, ...]
    prover: EndpointProver = http_challenge_prover
    resolve: Resolver = field(default=resolve_host)

    def admit(self, endpoint: str) -> str:
        """The endpoint's canonical form when policy allows it; else ``EndpointNotAllowed``."""
        return self.admitted(endpoint).url

    def admitted(self, endpoint: str) -> AdmittedEndpoint:
        """The endpoint's canonical form and identity when policy allows it; else
        ``EndpointNotAllowed``.

        No connection is made: only the name is looked at and resolved. A path is
        refused: one port is one node, or one port could carry any number of
        wallets (and a banned one come back under a new path).
        """
        try:
            canonical = canonical_endpoint(endpoint)
        except ValueError as error:
            raise EndpointNotAllowed(f"Endpoint {endpoint} is not allowed: {error}") from None
        parts = urlsplit(canonical)
        if parts.path:
            raise _not_allowed(canonical, "an endpoint is a scheme, host and port, without a path")
        host = (parts.hostname or "").rstrip(".")
        if host in METADATA_HOSTS or any(host.endswith(f".{name}") for name in METADATA_HOSTS):
            raise _not_allowed(canonical, f"{host} is a cloud metadata service")
        try:
            addresses = [ipaddress.ip_address(host)]
        except ValueError:
            resolved = {address.split("%", 1)[0] for address in self.resolve(host, parts.port or 0)}
            addresses = [ipaddress.ip_address(address) for address in sorted(resolved)]
        if not addresses:
            raise _not_allowed(canonical, f"{host} does not resolve")
        for address in map(unmapped, addresses):
            if always_refused(address):
                raise _not_allowed(
                    canonical,
                    f"{address} is a link-local, metadata or otherwise unroutable address",
                )
            if not any(address in network for network in self.networks):
                raise _not_allowed(
                    canonical,
                    f"{address} is outside the networks nodes may register from "
                    "(MESHNET_NODE_NETWORKS)",
                )
        port = parts.port or 0
        identities = {identity_of(address, port) for address in addresses}
        if len(identities) > 1:
            raise _not_allowed(
                canonical,
                f"{host} resolves to several addresses ({', '.join(sorted(identities))}); "
                "advertise one address",
            )
        return AdmittedEndpoint(url=canonical, identity=identities.pop())

    def prove(self, *, endpoint: str, wallet: str) -> AdmittedEndpoint:
        """Policy, then proof: raises ``EndpointNotAllowed`` or ``EndpointUnproven``."""
        admitted = self.admitted(endpoint)
        self.prover(endpoint=admitted.url, wallet=wallet)
        return admitted


def _not_allowed(endpoint: str, why: str) -> EndpointNotAllowed:
    return EndpointNotAllowed(f"Endpoint {endpoint} is not allowed: {why}")
