"""What the role's input chain decides for one new inbound TCP or UDP packet, worked out from the loaded table
(`nft -j list table`). The test network is IPv4 only, so this is how the tests check the IPv6 rules: the
same question asked for an IPv6 source must get the answer real IPv4 traffic got."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

# The packet asked about: new (no conntrack entry), on the node's network interface, from this source port.
IIF, SPORT = "eth0", 40000
# Statements that neither match nor decide.
_NO_OPS = {"counter", "comment", "log"}


class Packet:
    def __init__(self, saddr: str, proto: str, dport: int) -> None:
        self.addr = ipaddress.ip_address(saddr)
        self.family = "ip" if self.addr.version == 4 else "ip6"
        self.proto, self.dport = proto, dport

    def field(self, left: dict[str, Any]) -> object | None:
        """The packet's value of a match's left side; None when the packet has no such field (a TCP packet
        has no udp dport, an IPv4 one no ip6 saddr), so the match fails."""
        if "meta" in left or "ct" in left:
            key = left.get("meta", left.get("ct"))["key"]
            values = {
                "iif": IIF,
                "iifname": IIF,
                "state": "new",
                "l4proto": self.proto,
                "nfproto": "ipv4" if self.family == "ip" else "ipv6",
            }
            if key not in values:
                raise AssertionError(f"nftrules: no model for {left}")
            return values[key]
        payload = left["payload"]
        protocol, name = payload["protocol"], payload["field"]
        if protocol in ("ip", "ip6") and name == "saddr":
            return self.addr if protocol == self.family else None
        if protocol in ("tcp", "udp") and name in ("dport", "sport"):
            return (self.dport if name == "dport" else SPORT) if protocol == self.proto else None
        if protocol in ("icmp", "icmpv6"):
            return None
        raise AssertionError(f"nftrules: no model for {left}")


def _contains(right: object, value: object, sets: dict[str, list[object]]) -> bool:
    """Whether value is (in) the right side of a match: a named or anonymous set, range, prefix or value."""
    if isinstance(right, str) and right.startswith("@"):
        return any(_contains(element, value, sets) for element in sets[right[1:]])
    if isinstance(right, dict):
        return _contains_dict(right, value, sets)
    if isinstance(right, list):
        return value in right
    if isinstance(value, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return value == ipaddress.ip_address(str(right))
    return right == value


def _contains_dict(right: dict[str, Any], value: object, sets: dict[str, list[object]]) -> bool:
    if "set" in right:
        return any(_contains(element, value, sets) for element in right["set"])
    if "elem" in right:
        return _contains(right["elem"]["val"], value, sets)
    if "range" in right:
        low, high = right["range"]
        if not isinstance(value, int):
            low, high = ipaddress.ip_address(low), ipaddress.ip_address(high)
        return low <= value <= high
    if "prefix" in right:
        return value in ipaddress.ip_network(f"{right['prefix']['addr']}/{right['prefix']['len']}")
    raise AssertionError(f"nftrules: no model for {right}")


def verdict(listing: str, saddr: str, proto: str, dport: int, chain: str = "input") -> str:
    """accept or drop: the first rule of chain whose matches all hold decides, else the chain's policy."""
    items = json.loads(listing)["nftables"]
    sets = {i["set"]["name"]: i["set"].get("elem", []) for i in items if "set" in i}
    policy = next(i["chain"]["policy"] for i in items if "chain" in i and i["chain"]["name"] == chain)
    packet = Packet(saddr, proto, dport)
    for rule in (i["rule"] for i in items if "rule" in i and i["rule"]["chain"] == chain):
        for statement in rule["expr"]:
            ((kind, body),) = statement.items()
            if kind in _NO_OPS:
                continue
            if kind in ("accept", "drop"):
                return kind
            if kind != "match":
                raise AssertionError(f"nftrules: no model for {statement}")
            value = packet.field(body["left"])
            # A field the packet lacks fails the match whatever the operator, as nft's protocol dependency does.
            if value is None or _contains(body["right"], value, sets) == (body["op"] == "!="):
                break
    return policy
