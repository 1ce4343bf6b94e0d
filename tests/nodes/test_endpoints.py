"""The endpoint policy and the challenge signature, in process (no DNS, no connection)."""

from __future__ import annotations

import ipaddress

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from meshnet_site.environment import DEFAULT_NODE_NETWORKS
from nodes_app.endpoints import EndpointGate, EndpointNotAllowed, EndpointUnproven
from nodes_app.shared.signing import canonical_endpoint, sign_challenge, verify_challenge, wallet_of
from tests.support.endpoint_gate import isolated_gate

NONCE = "ab" * 32
EVERYTHING = ("0.0.0.0/0", "::/0")


def default_gate(resolves_to: str = "10.0.0.1") -> EndpointGate:
    return isolated_gate(networks=DEFAULT_NODE_NETWORKS, resolves_to=resolves_to)


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1:7001",
        "http://[::1]:7001",
        "http://10.1.2.3:7001",
        "http://172.20.0.5:7001",
        "http://192.168.1.20:7001/",
        "https://[fd12:3456::1]:443",
    ],
)
def test_loopback_and_private_addresses_are_allowed_by_default(endpoint: str) -> None:
    assert default_gate().admit(endpoint) == canonical_endpoint(endpoint)


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://169.254.169.254/latest/meta-data",
        "http://169.254.170.2/v2/credentials",
        "http://[fe80::1]:7001",
        "http://[fd00:ec2::254]/",
        "http://[::ffff:169.254.169.254]:80",
        "http://0.0.0.0:7001",
        "http://0.1.2.3:7001",
        "http://224.0.0.1:7001",
        "http://255.255.255.255:7001",
        "http://100.100.100.200/latest",
        "http://metadata.google.internal/computeMetadata/v1",
        "http://METADATA.GOOGLE.INTERNAL./",
        "http://instance-data.ec2.internal/",
        "http://metadata/",
    ],
)
def test_link_local_and_metadata_endpoints_are_refused_even_when_every_network_is_allowed(
    endpoint: str,
) -> None:
    with pytest.raises(EndpointNotAllowed) as refused:
        isolated_gate(networks=EVERYTHING).admit(endpoint)

    assert refused.value.code == "endpoint_not_allowed"


def test_a_name_that_resolves_to_a_metadata_address_is_refused() -> None:
    gate = isolated_gate(networks=EVERYTHING, resolves_to="169.254.169.254")

    with pytest.raises(EndpointNotAllowed, match=r"169\.254\.169\.254"):
        gate.admit("http://innocent.example:7001")


def test_a_public_address_is_refused_by_default_and_allowed_when_its_network_is_listed() -> None:
    with pytest.raises(EndpointNotAllowed, match="MESHNET_NODE_NETWORKS"):
        default_gate().admit("http://203.0.113.7:7001")

    allowed = isolated_gate(networks=("203.0.113.0/24",))
    assert allowed.admit("http://203.0.113.7:7001") == "http://203.0.113.7:7001"


def test_a_name_is_refused_when_any_of_its_addresses_lies_outside_the_networks() -> None:
    gate = EndpointGate(
        networks=tuple(ipaddress.ip_network(n) for n in DEFAULT_NODE_NETWORKS),
        resolve=lambda host, port: ["10.0.0.8", "8.8.8.8"],
    )

    with pytest.raises(EndpointNotAllowed, match=r"8\.8\.8\.8"):
        gate.admit("http://split.example:7001")


@pytest.mark.parametrize(
    "endpoint",
    [
        "ftp://10.0.0.1/",
        "file:///etc/passwd",
        "http://user:pw@10.0.0.1:7001",
        "http://10.0.0.1:7001/?next=x",
        "http://:7001",
        "http://10.0.0.1:99999",
    ],
)
def test_only_plain_http_urls_are_endpoints(endpoint: str) -> None:
    with pytest.raises(EndpointNotAllowed):
        isolated_gate(networks=EVERYTHING).admit(endpoint)


def test_a_name_that_does_not_resolve_is_refused_without_a_proof() -> None:
    proofs: list[str] = []
    gate = EndpointGate(
        networks=(ipaddress.ip_network("0.0.0.0/0"),),
        prover=lambda *, endpoint, wallet: proofs.append(endpoint),
        resolve=lambda host, port: [],
    )

    with pytest.raises(EndpointNotAllowed, match="does not resolve"):
        gate.prove(endpoint="http://nowhere.invalid:7001", wallet="ab" * 32)
    assert proofs == []


@given(st.ip_addresses(network="169.254.0.0/16") | st.ip_addresses(network="fe80::/10"))
def test_no_networks_setting_lets_a_link_local_address_through(address: object) -> None:
    host = f"[{address}]" if ":" in str(address) else str(address)
    gate = isolated_gate(networks=(*EVERYTHING, "169.254.0.0/16", "fe80::/10"))

    with pytest.raises(EndpointNotAllowed):
        gate.admit(f"http://{host}:7001")


def test_endpoint_spellings_share_one_canonical_form() -> None:
    spellings = ["http://Node.LAN:80", "http://node.lan", "http://node.lan/", "HTTP://node.lan:80/"]

    assert {canonical_endpoint(spelling) for spelling in spellings} == {"http://node.lan:80"}
    assert canonical_endpoint("http://[::1]:7001/") == "http://[::1]:7001"


def test_a_challenge_answer_proves_only_its_wallet_its_nonce_and_its_endpoint() -> None:
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    endpoint = "http://127.0.0.1:7001"
    signature = sign_challenge(key, NONCE, endpoint)

    assert verify_challenge(wallet_of(key), NONCE, "http://127.0.0.1:7001/", signature)
    assert not verify_challenge(wallet_of(other), NONCE, endpoint, signature)
    assert not verify_challenge(wallet_of(key), "cd" * 32, endpoint, signature)
    assert not verify_challenge(wallet_of(key), NONCE, "http://127.0.0.1:7002", signature)
    assert not verify_challenge(wallet_of(key), NONCE, endpoint, "00" * 64)


def test_the_isolated_prover_refuses_what_it_is_told_to() -> None:
    gate = isolated_gate(unproven={"http://10.0.0.9:7001"})

    gate.prove(endpoint="http://10.0.0.2:7001", wallet="ab" * 32)
    with pytest.raises(EndpointUnproven):
        gate.prove(endpoint="http://10.0.0.9:7001/", wallet="ab" * 32)


def test_spellings_of_one_socket_share_one_identity_and_other_ports_do_not() -> None:
    gate = EndpointGate(
        networks=tuple(ipaddress.ip_network(n) for n in DEFAULT_NODE_NETWORKS),
        resolve=lambda host, port: ["127.0.0.1", "::1"],  # what localhost resolves to
    )
    spellings = [
        "http://127.0.0.1:7001",
        "http://localhost:7001/",
        "https://LOCALHOST.:7001",
        "http://127.0.0.2:7001",
        "http://[::1]:7001",
        "http://[::ffff:127.0.0.1]:7001",
    ]

    assert {gate.admitted(spelling).identity for spelling in spellings} == {"loopback:7001"}
    assert gate.admitted("http://127.0.0.1:7002").identity == "loopback:7002"
    assert default_gate().admitted("http://10.1.2.3:7001").identity == "10.1.2.3:7001"


@pytest.mark.parametrize("endpoint", ["http://10.0.0.1:7001/a", "http://10.0.0.1:7001/a/b/"])
def test_an_endpoint_with_a_path_is_refused(endpoint: str) -> None:
    with pytest.raises(EndpointNotAllowed, match="without a path"):
        isolated_gate(networks=EVERYTHING).admit(endpoint)


def test_a_name_reaching_several_addresses_is_refused() -> None:
    gate = EndpointGate(
        networks=(ipaddress.ip_network("10.0.0.0/8"),),
        resolve=lambda host, port: ["10.0.0.8", "10.0.0.9"],
    )

    with pytest.raises(EndpointNotAllowed, match="several addresses"):
        gate.admit("http://pair.example:7001")
