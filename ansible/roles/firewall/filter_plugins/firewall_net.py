"""Address checks for the firewall role, with the standard library's ipaddress (netaddr is not installed)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _network(value: object) -> Network:
    # strict: "10.0.0.1/24" is refused rather than silently widened to 10.0.0.0/24.
    net = ipaddress.ip_network(str(value).strip(), strict=True)
    # ipaddress takes "fe80::1%eth0" (a zone), which an nft set cannot hold: refused here, before the node changes,
    # not by nft -c after it.
    if isinstance(net, ipaddress.IPv6Network) and net.network_address.scope_id is not None:
        raise ValueError(f"{value} has a scope (zone) id, which a firewall rule cannot hold")
    return net


def firewall_cidr_errors(values: Iterable[object]) -> list[str]:
    """One message per entry that is not an IPv4/IPv6 CIDR or address; empty when all are valid."""
    errors = []
    for value in values:
        try:
            _network(value)
        except ValueError as exc:
            errors.append(f"{value!r}: {exc}")
    return errors


def firewall_cidrs(values: Iterable[object], version: int) -> list[str]:
    """The entries of one IP version, normalised (single addresses as /32 or /128)."""
    return [str(net) for net in map(_network, values) if net.version == version]


def firewall_address_in(address: object, cidrs: Iterable[object]) -> bool:
    """Whether an address (IPv4, IPv6, or IPv4-mapped IPv6 as sshd reports it) lies in any of the CIDRs."""
    ip = ipaddress.ip_address(str(address).strip())
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in _network(cidr) for cidr in cidrs)


class FilterModule:
    def filters(self) -> dict[str, Callable[..., object]]:
        return {
            "firewall_cidr_errors": firewall_cidr_errors,
            "firewall_cidrs": firewall_cidrs,
            "firewall_address_in": firewall_address_in,
        }
