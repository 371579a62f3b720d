"""Where a call came from: the peer's address, or a forwarded one from a trusted proxy only.

The audit log's source address and the refused-call limit (:class:`~gpupool.control.services.
audit.RefusedCalls`) are keyed by it, so it must not be a client's word. ``X-Forwarded-For`` is
a header any client sets; it is read only when the connection's peer is one of the proxies the
admin named (``gpupool server --trusted-proxies CIDR,...``, ``ServerSettings.trusted_proxies``).
Then the header is read from its right end (the address the nearest proxy saw), skipping the
named proxies, and the first address that is not one of them is the caller. Without named
proxies (the default) the peer's address is the caller, whatever headers say. uvicorn's own
reading of the header (on by default for 127.0.0.1) is turned off where the server starts
(:mod:`gpupool.cli.server`), so this is the only place it is read.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.requests import HTTPConnection

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(values: Iterable[str]) -> tuple[Network, ...]:
    """CIDRs (``10.0.0.0/8``, ``192.0.2.7``) as networks; :class:`ValueError` naming a bad one."""
    found = []
    for value in values:
        try:
            found.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"trusted proxy {value!r} is not an address or a network: use e.g. "
                "10.0.0.5 or 10.0.0.0/24"
            ) from None
    return tuple(found)


def _within(address: str, networks: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    return any(ip in net for net in networks)


def client_address(conn: HTTPConnection) -> str | None:
    """The caller's address (see the module docstring)."""
    peer = conn.client.host if conn.client is not None else None
    networks: tuple[Network, ...] = getattr(conn.app.state, "trusted_proxies", ())
    return address_of(peer, networks, conn.headers.get("x-forwarded-for", ""))


def address_of(peer: str | None, networks: tuple[Network, ...], forwarded: str) -> str | None:
    """The caller's address from the peer's, the trusted proxies and ``X-Forwarded-For``
    (for callers without a Starlette connection: the HTTP protocol's short way)."""
    if peer is None or not networks or not _within(peer, networks):
        return peer
    hops = [h.strip() for h in forwarded.split(",") if h.strip()]
    for hop in reversed(hops):
        if not _within(hop, networks):
            try:
                return str(ipaddress.ip_address(hop))
            except ValueError:
                return peer  # a proxy passed on garbage: the proxy is what is known
    return peer
