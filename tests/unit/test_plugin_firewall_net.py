"""The firewall role's filters (firewall_net.py): which CIDRs the role accepts, how they reach the nft sets, and
whether the controller's address is let in. Pure functions, loaded by path like Ansible does; no Ansible needed."""

from pathlib import Path

import pytest
from _modules import load

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "ansible/roles/firewall/filter_plugins/firewall_net.py"
firewall_net = load("firewall_net", PLUGIN)

FILTERS = firewall_net.FilterModule().filters()
cidr_errors = FILTERS["firewall_cidr_errors"]
cidrs = FILTERS["firewall_cidrs"]
address_in = FILTERS["firewall_address_in"]


def test_the_plugin_offers_exactly_the_filters_the_role_uses():
    assert set(FILTERS) == {"firewall_cidr_errors", "firewall_cidrs", "firewall_address_in"}
    assert all(callable(f) for f in FILTERS.values())


VALID = [
    "10.0.0.0/8",
    "192.168.1.0/24",
    "0.0.0.0/0",
    "10.1.2.3",  # a single address
    "10.1.2.3/32",
    " 172.16.0.0/12\n",  # YAML block scalars leave whitespace behind
    "10.0.0.0/255.0.0.0",  # netmask notation
    "2001:db8::/32",
    "2001:DB8::1",
    "fd00::/8",
    "::/0",
    "::1",
    "::ffff:10.0.0.0/104",  # IPv4-mapped, as a v6 network
]


@pytest.mark.parametrize("value", VALID)
def test_valid_cidrs_and_addresses_have_no_errors(value):
    assert cidr_errors([value]) == []


INVALID = [
    # (entry, what the message says)
    ("10.0.0.1/24", "has host bits set"),  # strict: never silently widened to 10.0.0.0/24
    ("192.168.1.77/16", "has host bits set"),
    ("fd00::1/8", "has host bits set"),
    ("2001:db8::1/32", "has host bits set"),
    ("999.1.1.1/99", "does not appear to be an IPv4 or IPv6 network"),
    ("256.0.0.0/8", "does not appear to be an IPv4 or IPv6 network"),
    ("10.0.0.0/33", "does not appear to be an IPv4 or IPv6 network"),
    ("2001:db8::/129", "does not appear to be an IPv4 or IPv6 network"),
    ("10.0.0.0/", "does not appear to be an IPv4 or IPv6 network"),
    ("10.0.0/24", "does not appear to be an IPv4 or IPv6 network"),
    ("2001:db8:::/32", "does not appear to be an IPv4 or IPv6 network"),
    ("cluster.example.org", "does not appear to be an IPv4 or IPv6 network"),
    ("", "does not appear to be an IPv4 or IPv6 network"),
    (None, "does not appear to be an IPv4 or IPv6 network"),  # an empty YAML value
    (167772160, "does not appear to be an IPv4 or IPv6 network"),  # a bare integer is not an address here
    # nft sets hold plain addresses: a zone would pass here and only fail at nft -c, after the node changed.
    ("fe80::1%eth0", "scope"),
    ("fe80::%eth0/64", "scope"),
]


@pytest.mark.parametrize(("value", "reason"), INVALID)
def test_each_invalid_entry_gets_one_message_naming_it_and_why(value, reason):
    (message,) = cidr_errors([value])
    assert message.startswith(f"{value!r}: ")
    assert reason in message


def test_errors_are_one_per_bad_entry_in_input_order():
    values = ["10.0.0.0/8", "10.0.0.1/24", "2001:db8::/32", "999.1.1.1/99", "10.0.0.1/24"]
    errors = cidr_errors(values)
    assert [e.split(":")[0] for e in errors] == ["'10.0.0.1/24'", "'999.1.1.1/99'", "'10.0.0.1/24'"]
    assert cidr_errors([]) == []


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
    # The template only runs after firewall_cidr_errors passed; should it ever run first, it must fail, not widen.
    with pytest.raises(ValueError, match=r"host bits|does not appear|scope"):
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
