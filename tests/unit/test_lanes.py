"""tests/lanes.sh, which runs make test's container and VM lanes at once: every lane runs to its end, each
line carries its lane's name, and one failed lane fails the whole."""

import subprocess

from _modules import ROOT


def lanes(*words: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tests/lanes.sh", *words], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def test_lanes_run_side_by_side_and_each_line_carries_its_lane(tmp_path):
    # Each lane waits for the other's mark: run one after the other, the first would give up waiting.
    wait_for = (
        "touch {d}/{me}; for i in $(seq 100); do [ -e {d}/{other} ] && echo saw-{other} && exit 0; sleep 0.1; done;"
        " exit 1"
    )
    result = lanes(
        "a",
        wait_for.format(d=tmp_path, me="a", other="b"),
        "b",
        wait_for.format(d=tmp_path, me="b", other="a"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[a] saw-b" in result.stdout and "[b] saw-a" in result.stdout
    assert all(line.startswith(("[a] ", "[b] ")) for line in result.stdout.splitlines())


def test_one_failed_lane_fails_the_run_after_the_others_finish(tmp_path):
    result = lanes("ok", f"sleep 1; echo done > {tmp_path}/ok", "bad", "echo broken; exit 3")
    assert result.returncode == 1
    assert (tmp_path / "ok").read_text() == "done\n"  # the failure did not cut the other lane short
    assert "[bad] broken" in result.stdout and "[bad] === stage bad: 0 s, exit 3" in result.stdout
    assert "lanes failed: bad" in result.stderr


def test_a_failed_run_ends_naming_the_failed_tests_tasks_and_stages():
    noise = "; ".join(f"echo line{i}" for i in range(50))
    result = lanes(
        "ok",
        "echo 'FAILED in a passing lane is not a failure'",
        "bad",
        "echo '  \x1b[2m│\x1b[0m FAILED - RETRYING: [node0]: Wait for the job (3 retries left)';"
        f" echo '  \x1b[2m│\x1b[0m \x1b[31mFAILED\x1b[0m tests/test_x.py::test_y - AssertionError: 1 != 2'; {noise};"
        ' echo \'fatal: [node0]: FAILED! => {"msg": "boom"}\'; exit 3',
    )
    summary = result.stderr.split("what failed:", 1)[1].splitlines()
    assert summary[1:] == [
        "[bad]   │ FAILED tests/test_x.py::test_y - AssertionError: 1 != 2",
        '[bad] fatal: [node0]: FAILED! => {"msg": "boom"}',
        "[bad] === stage bad: 0 s, exit 3",
    ]
