"""The train role's filters: unknown variables, safe names, the first error line of a log, the run's outcome."""

from pathlib import Path

import pytest
from _modules import load

ROOT = Path(__file__).resolve().parents[2]
checks = load("train_checks", "ansible/roles/train/filter_plugins/train_checks.py")

KNOWN = ["train_steps", "train_job_name", "train_program_args", "__train_work_dir"]


def test_unknown_train_variables_name_the_closest_public_one():
    given = ["train_step", "train_steps", "cluster_user", "train_zzz_qqq", "train_wrok_dir"]
    assert checks.unknown_variables(given, KNOWN) == [
        "train_step: no such variable (did you mean train_steps?)",
        "train_wrok_dir: no such variable",  # never suggests an internal name
        "train_zzz_qqq: no such variable",
    ]


def test_first_error_line_skips_torchruns_report():
    log = "\n".join(
        [
            "step 1/10 | loss 2.3",
            "Traceback (most recent call last):",
            '  File "train.py", line 3, in <module>',
            "[rank 1] config error: unknown key 'optim.lerning_rate'",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
            "  Root Cause (first observed failure):",
        ]
    )
    assert checks.first_error_line(log) == "[rank 1] config error: unknown key 'optim.lerning_rate'"
    assert checks.first_error_line("all well\n") is None


def report(job, node=None, reason=None):
    return {"job": job, "failed_node": node, "reason": reason}


@pytest.mark.parametrize(
    ("polled", "ended", "lost", "broken", "stop", "expected"),
    [
        ([report("running")], [report("succeeded")], [], {}, False, {"status": "succeeded"}),
        ([], [report("stopped")], [], {}, False, {"status": "cancelled"}),
        ([], [report("running")], [], {}, True, {"status": "cancelled"}),
        # A stop request never hides a failure that happened on its own.
        (
            [],
            [report("failed", "n1", "exit code 1")],
            [],
            {},
            True,
            {"status": "failed", "node": "n1", "reason": "exit code 1"},
        ),
        # A silent node seen while the others ran is the cause, whatever the nodes say after the stop.
        (
            [report("failed", "n1", "no heartbeat for 40 s")],
            [report("failed", "n0", "exit code 1")],
            [],
            {},
            False,
            {"status": "failed", "node": "n1", "reason": "no heartbeat for 40 s"},
        ),
        (
            [report("failed", "n0", "exit code 1")],
            [report("failed", "n1", "exit code 137")],
            [],
            {},
            False,
            {"status": "failed", "node": "n1", "reason": "exit code 137"},
        ),
        (
            [],
            [report("failed", "n0", "exit code 1")],
            ["n1"],
            {},
            False,
            {"status": "failed", "node": "n1", "reason": "unreachable during the run"},
        ),
        ([], [report("succeeded")], [], {"n0": "boom"}, False, {"status": "failed", "node": "n0", "reason": "boom"}),
        (
            [],
            [report("running")],
            [],
            {},
            False,
            {"status": "failed", "node": None, "reason": "the nodes report the job running"},
        ),
    ],
)
def test_outcome(polled, ended, lost, broken, stop, expected):
    assert checks.outcome(polled, ended, lost, broken, stop) == expected
