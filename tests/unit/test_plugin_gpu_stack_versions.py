"""The gpu_stack role's filters (gpu_stack_versions.py): one version per component from dpkg-query, and the
cross-node comparison (reference value, mismatches, drift from the inventory, the table). Loaded by path."""

from pathlib import Path

import pytest
from _modules import load

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "ansible/roles/gpu_stack/filter_plugins/gpu_stack_versions.py"
gpu_stack_versions = load("gpu_stack_versions", PLUGIN)

FILTERS = gpu_stack_versions.FilterModule().filters()
dpkg_summary = FILTERS["gpu_stack_dpkg_summary"]
compare = FILTERS["gpu_stack_compare"]

DRIVER = "535.216.03-2~bpo12+1"
OTHER_DRIVER = "535.183.01-1~bpo12+1"
# The role's columns (vars/main.yml), less the ones these tests do not need.
COLUMNS = [
    {"key": "driver", "title": "driver (dpkg)", "scope": "driver"},
    {"key": "cuda", "title": "CUDA (dpkg)", "scope": "cuda"},
    {"key": "image_torch", "title": "image torch", "scope": "image"},
]


def test_the_plugin_offers_exactly_the_filters_the_role_uses():
    assert set(FILTERS) == {"gpu_stack_compare", "gpu_stack_dpkg_summary"}


# --- gpu_stack_dpkg_summary: lines of `dpkg-query --show` "${Package} ${Version} ${db:Status-Want} ${db:Status-Status}"

PACKAGES = ["nvidia-driver", "nvidia-kernel-dkms", "libcuda1"]


def installed(name, version, want="install"):
    return f"{name} {version} {want} installed"


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([], "absent"),
        # Not installed: dpkg-query prints an empty version, so three fields.
        (["nvidia-driver  unknown not-installed", "libcuda1  unknown not-installed"], "absent"),
        # Removed but its configuration kept: not installed.
        ([f"nvidia-driver {DRIVER} deinstall config-files"], "absent"),
        ([f"nvidia-driver {DRIVER} install half-configured"], "absent"),
        # Other packages' lines never count.
        ([installed("firmware-misc-nonfree", DRIVER)], "absent"),
        ([installed(p, DRIVER) for p in PACKAGES], DRIVER),
        # Held packages are installed all the same.
        ([installed(p, DRIVER, want="hold") for p in PACKAGES], DRIVER),
        ([installed(p, DRIVER) for p in reversed(PACKAGES)], DRIVER),
        ([installed("nvidia-driver", DRIVER)], f"{DRIVER} (missing nvidia-kernel-dkms,libcuda1)"),
        (
            [
                installed("libcuda1", DRIVER),
                installed("nvidia-driver", DRIVER),
                "nvidia-kernel-dkms  unknown not-installed",
            ],
            f"{DRIVER} (missing nvidia-kernel-dkms)",
        ),
        (
            [installed("nvidia-driver", DRIVER), installed("libcuda1", OTHER_DRIVER)],
            f"mixed libcuda1={OTHER_DRIVER},nvidia-driver={DRIVER}",
        ),
        (
            [installed(p, DRIVER) for p in PACKAGES[:2]] + [installed("libcuda1", OTHER_DRIVER)],
            f"mixed libcuda1={OTHER_DRIVER},nvidia-driver={DRIVER},nvidia-kernel-dkms={DRIVER}",
        ),
        # Lines that are not four fields (a warning, a name with nothing else) are ignored.
        (
            ["dpkg-query: no packages found matching libcuda1", installed("nvidia-driver", DRIVER)],
            f"{DRIVER} (missing nvidia-kernel-dkms,libcuda1)",
        ),
        ([f"nvidia-driver {DRIVER} install installed extra", "nvidia-driver"], "absent"),
    ],
)
def test_dpkg_summary(lines, expected):
    assert dpkg_summary(lines, PACKAGES) == expected


def test_dpkg_summary_of_a_single_package_component():
    assert dpkg_summary([installed("libnccl2", "2.22.3-1-1")], ["libnccl2"]) == "2.22.3-1-1"
    assert dpkg_summary([installed("libnccl2", "2.22.3-1-1")], []) == "absent"


def test_dpkg_versions_compare_as_exact_strings():
    # No version ordering, no normalisation: an epoch or another revision is another version.
    lines = [installed("nvidia-driver", DRIVER), installed("libcuda1", f"1:{DRIVER}")]
    assert dpkg_summary(lines, ["nvidia-driver", "libcuda1"]).startswith("mixed ")


# --- gpu_stack_compare


def row(node, values, scopes=("driver", "cuda"), wanted=None):
    row = {"node": node, "scopes": list(scopes), "values": values}
    if wanted is not None:
        row["wanted"] = wanted
    return row


def test_all_nodes_alike_no_mismatch_no_drift_no_mark():
    rows = [row(f"node{i}", {"driver": DRIVER, "cuda": "12.4"}, wanted={"driver": DRIVER}) for i in range(3)]
    result = compare(rows, COLUMNS)
    assert result["mismatches"] == []
    assert result["drift"] == []
    assert all(" *" not in line for line in result["table"].splitlines()[:-1])


def test_the_golden_table():
    rows = [
        row("node0", {"driver": DRIVER, "cuda": "12.4"}),
        row("node1", {"driver": OTHER_DRIVER, "cuda": "12.4"}),
        row("n2", {"driver": DRIVER}, scopes=("driver",)),
    ]
    assert compare(rows, COLUMNS)["table"].splitlines() == [
        "node       driver (dpkg)           CUDA (dpkg)",
        "---------  ----------------------  -----------",
        f"node0      {DRIVER}    12.4",
        f"node1      {OTHER_DRIVER} *  12.4",
        f"n2         {DRIVER}    -",
        f"reference  {DRIVER}    12.4",
        "* differs from the reference: the value most nodes have (on a tie, the first node's). "
        "- = not expected on that node.",
    ]


def test_the_majority_is_the_reference_wherever_it_sits():
    rows = [
        row("node0", {"driver": OTHER_DRIVER}, scopes=("driver",)),
        row("node1", {"driver": DRIVER}, scopes=("driver",)),
        row("node2", {"driver": DRIVER}, scopes=("driver",)),
    ]
    result = compare(rows, COLUMNS)
    assert result["mismatches"] == [f"node0: driver (dpkg) is {OTHER_DRIVER}, reference {DRIVER} (2 of 3 nodes)"]
    assert result["table"].splitlines()[-2].split() == ["reference", DRIVER]
    assert result["table"].splitlines()[2].endswith(f"{OTHER_DRIVER} *")


@pytest.mark.parametrize("first", [DRIVER, OTHER_DRIVER])
def test_a_tie_takes_the_first_nodes_value_and_says_so(first):
    second = OTHER_DRIVER if first == DRIVER else DRIVER
    rows = [
        row("node0", {"driver": first}, scopes=("driver",)),
        row("node1", {"driver": second}, scopes=("driver",)),
    ]
    result = compare(rows, COLUMNS)
    assert result["mismatches"] == [
        f"node1: driver (dpkg) is {second}, reference {first} (tie, taken from node0, the first node with it)"
    ]


def test_a_tie_names_the_first_node_in_scope_with_the_reference():
    # node0 has no driver column, so the tie is between node1's and node2's values; node1 comes first.
    rows = [
        row("node0", {"cuda": "12.4"}, scopes=("cuda",)),
        row("node1", {"driver": OTHER_DRIVER, "cuda": "12.4"}),
        row("node2", {"driver": DRIVER, "cuda": "12.4"}),
        row("node3", {"driver": DRIVER, "cuda": "12.4"}),
        row("node4", {"driver": OTHER_DRIVER, "cuda": "12.4"}),
    ]
    result = compare(rows, COLUMNS)
    tie = "(tie, taken from node1, the first node with it)"
    assert result["mismatches"] == [
        f"node2: driver (dpkg) is {DRIVER}, reference {OTHER_DRIVER} {tie}",
        f"node3: driver (dpkg) is {DRIVER}, reference {OTHER_DRIVER} {tie}",
    ]


def test_a_three_way_split_is_a_tie_too():
    rows = [row(f"node{i}", {"driver": v}, scopes=("driver",)) for i, v in enumerate(["a-1", "b-1", "c-1"])]
    mismatches = compare(rows, COLUMNS)["mismatches"]
    assert len(mismatches) == 2
    assert all(m.endswith("reference a-1 (tie, taken from node0, the first node with it)") for m in mismatches)


@pytest.mark.parametrize(
    ("values", "how"),
    [
        # A clear majority over several different minorities is still a majority, not a tie.
        (["a-1", "a-1", "a-1", "b-1", "c-1"], "(3 of 5 nodes)"),
        # Two values tied for most, with a third behind them: a tie.
        (["a-1", "b-1", "a-1", "b-1", "c-1"], "(tie, taken from node0, the first node with it)"),
    ],
)
def test_majority_or_tie_with_more_than_two_values(values, how):
    rows = [row(f"node{i}", {"driver": v}, scopes=("driver",)) for i, v in enumerate(values)]
    mismatches = compare(rows, COLUMNS)["mismatches"]
    assert mismatches
    assert all(m.endswith(f"reference a-1 {how}") for m in mismatches)


def test_a_single_node_is_its_own_reference():
    result = compare([row("node0", {"driver": DRIVER}, scopes=("driver",))], COLUMNS)
    assert result["mismatches"] == []
    assert result["table"].splitlines()[-2].split() == ["reference", DRIVER]


def test_only_nodes_in_scope_count_and_a_missing_value_is_unknown():
    rows = [
        row("node0", {"driver": DRIVER}),  # in the cuda scope, but reports nothing for it
        row("node1", {"driver": DRIVER, "cuda": "12.4"}),
        row("node2", {"driver": DRIVER, "cuda": "12.4"}),
        row("node3", {"driver": "whatever", "cuda": "11.8"}, scopes=()),  # expects neither: never compared
    ]
    result = compare(rows, COLUMNS)
    assert result["mismatches"] == ["node0: CUDA (dpkg) is unknown, reference 12.4 (2 of 3 nodes)"]
    table = result["table"].splitlines()
    assert table[2].split() == ["node0", DRIVER, "unknown", "*"]
    assert table[5].split() == ["node3", "-", "-"]


def test_columns_no_node_expects_are_left_out():
    rows = [row("node0", {"driver": DRIVER, "image_torch": "2.5.1"}), row("node1", {"driver": DRIVER})]
    header = compare(rows, COLUMNS)["table"].splitlines()[0]
    assert "image torch" not in header
    assert "driver (dpkg)" in header
    assert "CUDA (dpkg)" in header


def test_values_are_compared_as_strings():
    # YAML may hand over numbers: 12.4 and "12.4" are the same version, 12.40 prints as 12.4 too.
    rows = [row("node0", {"cuda": 12.4}, scopes=("cuda",)), row("node1", {"cuda": "12.4"}, scopes=("cuda",))]
    assert compare(rows, COLUMNS)["mismatches"] == []


def test_nothing_to_compare_says_so_with_the_nodes():
    rows = [row("node0", {}, scopes=()), row("node1", {}, scopes=())]
    result = compare(rows, COLUMNS)
    assert result == {
        "table": "Nothing to compare on node0, node1: no node is expected to have a driver, CUDA or NCCL with a "
        "version set.",
        "mismatches": [],
        "drift": [],
    }


def test_drift_is_the_installed_version_against_the_inventory_of_that_node():
    rows = [
        row("node0", {"driver": DRIVER, "cuda": "12.4"}, wanted={"driver": DRIVER, "cuda": "12.4"}),
        row("node1", {"driver": DRIVER, "cuda": "12.4"}, wanted={"driver": OTHER_DRIVER}),
        # In agreement with its peers, yet not what its own inventory asks for: drift, not a mismatch.
        row("node2", {"driver": DRIVER, "cuda": "absent"}, wanted={"cuda": "12.4"}),
    ]
    result = compare(rows, COLUMNS)
    assert result["mismatches"] == ["node2: CUDA (dpkg) is absent, reference 12.4 (2 of 3 nodes)"]
    assert result["drift"] == [
        f"node1: driver (dpkg) is {DRIVER}, its inventory asks for {OTHER_DRIVER}",
        "node2: CUDA (dpkg) is absent, its inventory asks for 12.4",
    ]


def test_no_drift_without_a_wanted_version_or_outside_the_scope():
    rows = [
        row("node0", {"driver": DRIVER}),  # no "wanted" at all
        row("node1", {"driver": DRIVER}, wanted={}),
        row("node2", {"driver": DRIVER}, scopes=("cuda",), wanted={"driver": OTHER_DRIVER}),
    ]
    assert compare(rows, COLUMNS)["drift"] == []


def test_drift_compares_as_strings_too():
    rows = [row("node0", {"cuda": "12"}, scopes=("cuda",), wanted={"cuda": 12})]
    assert compare(rows, COLUMNS)["drift"] == []
