"""Per-address limit on node registrations, counted before any signature work.

A registration costs the tracker a signature check, database writes and
(for a valid one) a topology change; fresh wallets are free to make. So
each client address may register at most so many times a minute, counted
in the database (``meshnet_site.guards``) where every tracker process sees
the same count and no flood can evict it. An IPv6 client is counted by its
/64 network, which one host typically holds whole.
"""

from __future__ import annotations

import ipaddress
from datetime import datetime

from meshnet_site.errors import DomainError, ErrorKind
from meshnet_site.guards.services import count_hit, window_retry_after

WINDOW_SECONDS = 60


class RegistrationRateLimited(DomainError):
    """This address sent too many registrations this minute; ``retry_after`` says when the
    next window opens."""

    kind = ErrorKind.RATE_LIMITED
    code = "registration_rate_limited"


def client_network(address: str) -> str:
    """What one client's registrations are counted under: its IPv4 address, or the /64
    network of an IPv6 address (an IPv4-mapped one counts as the IPv4 address)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address  # not an IP (a unix socket, a test client): counted as given
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def registration_rate_limit_check(*, client_address: str, limit: int, now: datetime) -> None:
    """Count one registration from ``client_address``; ``RegistrationRateLimited`` past
    ``limit`` in the current minute."""
    network = client_network(client_address)
    count = count_hit(f"registration:{network}", window_seconds=WINDOW_SECONDS, now=now)
    if count > limit:
        retry_after = window_retry_after(window_seconds=WINDOW_SECONDS, now=now)
        raise RegistrationRateLimited(
            f"Too many node registrations from {network}: at most {limit} per minute; "
            f"retry in {retry_after} s",
            retry_after=retry_after,
        )
