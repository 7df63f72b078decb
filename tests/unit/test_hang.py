"""train_hang_after_s: a run whose ranks report no new step is stopped as hung, naming the node whose ranks stopped
first, with their stacks in its log. The decision (ddp_node.job_state) on status files, and the whole path through
`make train` on inventory/local with a rank wedged before a collective."""

import json
import re
import uuid

import pytest
from _make import ROOT, make_train, node_log, processes_of, run_record
from _modules import load
from _node_runner import ddp_node

HANG = load("jobs", ROOT / "molecule" / "shared" / "jobs.py").HANG
NODES = ["node0", "node1"]


def write_status(directory, node, beat, step=None):
    progress = {"step": step, "ranks": 4} if step is not None else None
    status = {"beat": beat, "exit_code": None, "ended": None, "stopped": False, "progress": progress}
    (directory / f"status-{node}.json").write_text(json.dumps(status))


def state(tmp_path, seen, now, hang_after_s=60.0):
    return ddp_node.job_state(tmp_path, NODES, 1e9, now, seen, hang_after_s=hang_after_s)


def test_the_node_a_step_behind_is_named_once_it_stands_still_past_the_limit(tmp_path):
    seen = {}
    write_status(tmp_path, "node0", beat=1, step=7)
    write_status(tmp_path, "node1", beat=1, step=6)
    assert state(tmp_path, seen, 1000.0) == {"job": "running"}
    write_status(tmp_path, "node0", beat=2, step=7)  # beats go on: the nodes are alive, their ranks are not
    write_status(tmp_path, "node1", beat=2, step=6)
    assert state(tmp_path, seen, 1059.0) == {"job": "running"}
    hung = state(tmp_path, seen, 1061.0)
    assert hung == {
        "job": "failed",
        "failed_node": "node1",
        "hung": True,
        "reason": "no progress for 61 s (train_hang_after_s): the ranks of node1 stopped at step 6",
    }


def test_steps_that_advance_keep_a_run_alive_however_long_it_runs(tmp_path):
    seen = {}
    for beat, now in enumerate((1000.0, 1050.0, 1100.0, 1150.0), 1):
        write_status(tmp_path, "node0", beat=beat, step=beat)
        write_status(tmp_path, "node1", beat=beat, step=beat)
        assert state(tmp_path, seen, now) == {"job": "running"}


def test_with_every_node_at_one_step_the_one_without_a_new_step_for_longest_is_named(tmp_path):
    seen = {}
    write_status(tmp_path, "node0", beat=1, step=4)
    write_status(tmp_path, "node1", beat=1, step=3)
    state(tmp_path, seen, 1000.0)
    write_status(tmp_path, "node1", beat=2, step=4)  # node1 reached step 4 later than node0
    state(tmp_path, seen, 1010.0)
    assert state(tmp_path, seen, 1070.0)["failed_node"] == "node0"


def test_a_program_that_reports_no_steps_is_never_judged_and_zero_turns_it_off(tmp_path):
    seen = {}
    write_status(tmp_path, "node0", beat=1)
    write_status(tmp_path, "node1", beat=1)
    # Left to the master's poll, which judges such a program by its metrics lines.
    running_unjudged = {"job": "running", "steps_unreported": True}
    assert state(tmp_path, seen, 1000.0) == state(tmp_path, seen, 99999.0) == running_unjudged
    write_status(tmp_path, "node0", beat=2, step=5)
    write_status(tmp_path, "node1", beat=2, step=5)
    assert state(tmp_path, {}, 1000.0, hang_after_s=0) == state(tmp_path, {}, 99999.0, hang_after_s=0)


def test_a_node_whose_ranks_report_nothing_while_its_peers_do_is_the_one_behind(tmp_path):
    seen = {}
    write_status(tmp_path, "node0", beat=1, step=2)
    write_status(tmp_path, "node1", beat=1)
    state(tmp_path, seen, 1000.0)
    assert state(tmp_path, seen, 1061.0)["reason"].endswith("the ranks of node1 stopped before reporting any step")


def test_the_node_runner_reports_the_slowest_ranks_step(tmp_path):
    assert ddp_node.ranks_progress(tmp_path) is None
    (tmp_path / "rank-0").write_text("12\n")
    (tmp_path / "rank-1").write_text("11\n")
    (tmp_path / "rank-2.partial").write_text("1")  # a write in progress is not a rank's word
    assert ddp_node.ranks_progress(tmp_path) == {"step": 11, "ranks": 2}


def hung_run(tmp_path, name, source, hang_after_s):
    """`make train` of the program source (as <name>.py) with train_hang_after_s: the finished make, its run id,
    and the line that says why the run failed."""
    program = tmp_path / "code" / f"{name}.py"
    program.parent.mkdir()
    program.write_text(source)
    done, run_id = make_train(
        f"PROGRAM={program}",
        f"JOB=unit-{name}-{uuid.uuid4().hex[:8]}",
        f"EXTRA_VARS={json.dumps({'train_hang_after_s': hang_after_s, 'train_poll_interval_s': 2})}",
    )
    assert done.returncode != 0
    failed = next(line for line in done.stderr.splitlines() if line.startswith("  FAILED [localhost] training run"))
    return done, run_id, failed


@pytest.mark.slow
def test_a_rank_wedged_before_a_collective_is_stopped_named_and_its_stack_dumped(tmp_path):
    done, run_id, failed = hung_run(tmp_path, "hang", HANG, 8)
    assert " failed on node localhost: no progress for " in failed, failed
    assert failed.endswith("s (train_hang_after_s): the ranks of localhost stopped at step 2."), failed
    record = run_record(run_id)
    assert record["status"] == "failed" and record["failed_node"] == "localhost"
    log = node_log(run_id)
    # The ranks' stacks end the log, and so the failure's last lines: the wedged rank's own frame, where it waits
    # in the program's source, and its peer in the collective.
    stacks = done.stderr[done.stderr.index("ddp_node: the run made no progress; its ranks' stacks") :]
    assert re.search(r"rank 1 \(pid \d+\):\n\s+Thread \d+ \(idle\): .MainThread.\n\s+<module> \(hang.py:9\)", stacks), (
        stacks
    )
    assert re.search(r"rank 0 \(pid \d+\):\n.*\n\s+all_reduce \(torch/distributed/distributed_c10d.py", stacks), stacks
    assert "ddp_node: the run made no progress; its ranks' stacks" in log
    assert processes_of(run_id) == ""


def test_without_rank_steps_the_masters_metrics_lines_are_judged_instead(tmp_path):
    seen = {}
    assert ddp_node._metrics_stalled(None, seen, 1000.0, 60.0, "node0") is None  # no line yet: not judged
    assert ddp_node._metrics_stalled({"step": 4}, seen, 1000.0, 60.0, "node0") is None
    assert ddp_node._metrics_stalled({"step": 5}, seen, 1050.0, 60.0, "node0") is None  # a new step
    assert ddp_node._metrics_stalled({"step": 5}, seen, 1110.0, 60.0, "node0") is None
    assert ddp_node._metrics_stalled({"step": 5}, seen, 1111.0, 60.0, "node0") == {
        "job": "failed",
        "failed_node": "node0",
        "hung": True,
        "reason": "no new metrics line for 61 s (train_hang_after_s): the run's metrics stopped at step 5, and its "
        "ranks report no step (DDP_PROGRESS_DIR) that would name the node",
    }


# Writes two metrics lines and then stands still, reporting no rank step (DDP_PROGRESS_DIR) at all.
STALLS = """import json, os, pathlib, time
if os.environ["RANK"] == "0":
    with open(pathlib.Path(os.environ["DDP_OUTPUT_DIR"]) / "metrics.jsonl", "a") as metrics:
        for step in (1, 2):
            metrics.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\\n")
            metrics.flush()
time.sleep(3600)
"""


@pytest.mark.slow
def test_a_program_whose_metrics_stop_is_stopped_as_hung_through_make_train(tmp_path):
    _, run_id, failed = hung_run(tmp_path, "stalls", STALLS, 6)
    assert " failed on node localhost: no new metrics line for " in failed, failed
    assert "s (train_hang_after_s): the run's metrics stopped at step 2, and its ranks" in failed, failed
    assert run_record(run_id)["status"] == "failed"
    assert processes_of(run_id) == ""
