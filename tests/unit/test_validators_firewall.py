"""The two validators the firewall role renders with (ansible/plugins/filter/ddp_validators.py): how the cluster's
and the admins' CIDRs reach the nft sets, one set per IP version, and whether the controller's address is let in.
Which CIDRs are accepted at all is test_validators.py's table. Pure functions, loaded by path like Ansible does."""

from pathlib import Path

import pytest
from _modules import load

ROOT = Path(__file__).resolve().parents[2]
FILTERS = load("ddp_validators", ROOT / "ansible/plugins/filter/ddp_validators.py").FilterModule().filters()
cidrs = FILTERS["ddp_cidrs_of_family"]
address_in = FILTERS["ddp_address_in"]


@pytest.mark.parametrize(
    ("values", "version", "expected"),
    [
        (["10.0.0.0/8", "2001:db8::/32", "10.1.2.3"], 4, ["10.0.0.0/8", "10.1.2.3/32"]),
        (["10.0.0.0/8", "2001:db8::/32", "2001:DB8::1"], 6, ["2001:db8::/32", "2001:db8::1/128"]),
        ([" 172.16.0.0/12\n", "10.0.0.0/255.0.0.0"], 4, ["172.16.0.0/12", "10.0.0.0/8"]),
        (["::ffff:10.0.0.0/104"], 4, []),  # a mapped network is an IPv6 network: it goes to the v6 set
        (["::ffff:10.0.0.0/104"], 6, ["::ffff:a00:0/104"]),
        (["0.0.0.0/0", "::/0"], 4, ["0.0.0.0/0"]),
        (["0.0.0.0/0", "::/0"], 6, ["::/0"]),
        (["10.0.0.0/8"], 6, []),
        ([], 4, []),
    ],
)
def test_cidrs_of_one_version_normalised_in_order(values, version, expected):
    assert cidrs(values, version) == expected


@pytest.mark.parametrize("bad", ["10.0.0.1/24", "999.1.1.1/99", "fe80::1%eth0"])
def test_cidrs_never_renders_an_entry_the_checks_refuse(bad):
    # The template only runs after validate.yml's checks passed; should it ever run first, it must fail, not widen.
    with pytest.raises(ValueError, match=r"host bits|not an IP network|scope"):
        cidrs(["10.0.0.0/8", bad], 4)


ADMIN = ["10.0.0.0/8", "2001:db8::/32", "192.168.7.4"]


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("10.20.30.40", True),
        ("11.0.0.1", False),
        ("192.168.7.4", True),  # a single-address entry
        ("192.168.7.5", False),
        ("2001:db8::42", True),
        ("2001:db9::42", False),
        # sshd on a dual-stack socket reports IPv4 peers as IPv4-mapped IPv6: judged as the IPv4 address.
        ("::ffff:10.20.30.40", True),
        ("::FFFF:192.168.7.4", True),
        ("::ffff:11.0.0.1", False),
        ("::ffff:192.168.7.5", False),
        (" 10.20.30.40\n", True),
        ("::10.20.30.40", False),  # IPv4-compatible (deprecated), not mapped: stays IPv6
    ],
)
def test_address_in(address, expected):
    assert address_in(address, ADMIN) is expected


def test_a_mapped_address_is_judged_as_the_firewall_sees_it():
    # The packets of an IPv4 peer are IPv4 packets to nftables, whatever sshd prints: a ::ffff: network in the
    # v6 set never lets them in, so saying yes here would let the play lock the controller out.
    assert address_in("::ffff:10.20.30.40", ["::ffff:10.0.0.0/104"]) is False
    assert address_in("::ffff:10.20.30.40", ["::ffff:10.0.0.0/104", "10.20.0.0/16"]) is True


def test_an_empty_list_lets_nobody_in():
    assert address_in("10.0.0.1", []) is False
    assert address_in("::ffff:10.0.0.1", []) is False


@pytest.mark.parametrize("address", ["", "not-an-address", "10.0.0.0/8", "999.1.1.1"])
def test_an_unreadable_address_is_an_error_never_a_yes(address):
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 address"):
        address_in(address, ["0.0.0.0/0", "::/0"])


def test_address_in_refuses_a_bad_cidr_rather_than_widening_it():
    # strict=False would read 10.0.0.1/24 as 10.0.0.0/24 and say yes to 10.0.0.7.
    with pytest.raises(ValueError, match="has host bits set"):
        address_in("10.0.0.7", ["10.0.0.1/24"])
