"""ddp_train/checkpoint.py: atomic files, integrity, keep-last-K, choosing the checkpoint to resume from."""

import hashlib
import os
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from ddp_train import checkpoint as ckpt

KEYS = {key: 0 for key in ckpt.REQUIRED} | {"format_version": ckpt.FORMAT_VERSION}


def state(step):
    return KEYS | {"step": step, "model": {"w": torch.full((4,), float(step))}}


def save(directory, step):
    path = ckpt.checkpoint_path(directory, step)
    ckpt.atomic_save(state(step), path)
    return path


def test_names_sort_by_step(tmp_path):
    for step in (3, 12, 100):
        save(tmp_path, step)
    assert [p.name for _, p in ckpt.list_checkpoints(tmp_path)] == [
        "ckpt-00000003.pt",
        "ckpt-00000012.pt",
        "ckpt-00000100.pt",
    ]


def test_atomic_save_leaves_only_the_file_and_its_digest(tmp_path):
    path = ckpt.checkpoint_path(tmp_path, 7)
    returned = ckpt.atomic_save(state(7), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000007.pt", "ckpt-00000007.pt.sha256"]
    digest, name = (tmp_path / "ckpt-00000007.pt.sha256").read_text().split()
    assert name == path.name and returned == digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert ckpt.load_checkpoint(path)["model"]["w"].tolist() == [7.0] * 4
    assert path.stat().st_mode & 0o777 == 0o644


def test_the_first_save_creates_the_checkpoint_directory(tmp_path: Path) -> None:
    directory = tmp_path / "run" / "ckpt"  # nothing else creates checkpoint.dir
    path = save(directory, 1)
    assert ckpt.list_checkpoints(directory) == [(1, path)]


def test_saves_leave_no_file_descriptor_open(tmp_path: Path) -> None:
    save(tmp_path, 1)  # imports and caches settle first
    before = sorted(Path("/proc/self/fd").iterdir())
    for step in range(2, 5):
        save(tmp_path, step)
    assert sorted(Path("/proc/self/fd").iterdir()) == before  # a long run writes thousands of checkpoints


def test_a_temp_file_left_by_a_killed_writer_goes_at_the_next_prune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names: list[str] = []
    real_mkstemp = tempfile.mkstemp

    def mkstemp(**kwargs: Any) -> tuple[int, str]:
        fd, name = real_mkstemp(**kwargs)
        names.append(name)
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    save(tmp_path, 1)
    assert len(names) == 2  # the file's and its digest's
    for name in names:  # what a writer killed before its renames leaves behind, under the names it uses
        Path(name).write_bytes(b"partial")
    ckpt.prune(tmp_path, keep_last=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000001.pt", "ckpt-00000001.pt.sha256"]


def test_a_failed_save_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    path = save(tmp_path, 5)
    before = path.read_bytes()

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        ckpt.atomic_save(KEYS | {"step": 5, "model": Unpicklable()}, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000005.pt", "ckpt-00000005.pt.sha256"]


def test_keep_last_prunes_oldest_and_stale_temp_files(tmp_path):
    for step in range(1, 6):
        save(tmp_path, step)
    (tmp_path / ".ckpt-00000006.pt.abc.tmp").write_bytes(b"partial")
    removed = ckpt.prune(tmp_path, keep_last=2)
    assert [p.name for p in removed] == ["ckpt-00000001.pt", "ckpt-00000002.pt", "ckpt-00000003.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-00000004.pt",
        "ckpt-00000004.pt.sha256",
        "ckpt-00000005.pt",
        "ckpt-00000005.pt.sha256",
    ]
    assert ckpt.prune(tmp_path, keep_last=0) == []  # 0 keeps all
    assert ckpt.prune(tmp_path, keep_last=3) == []  # fewer than keep_last: none go


def test_prune_removes_an_old_checkpoint_that_lost_its_digest(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save(tmp_path, step)
    (tmp_path / "ckpt-00000001.pt.sha256").unlink()  # a writer killed between the file's rename and its digest's
    assert [p.name for p in ckpt.prune(tmp_path, keep_last=1)] == ["ckpt-00000001.pt", "ckpt-00000002.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000003.pt", "ckpt-00000003.pt.sha256"]


def test_truncated_newest_is_skipped_with_a_warning(tmp_path):
    save(tmp_path, 10)
    newest = save(tmp_path, 20)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    warnings = []
    path, loaded = ckpt.choose_resume("auto", tmp_path, warnings.append)
    assert (path.name, loaded["step"]) == ("ckpt-00000010.pt", 10)
    assert len(warnings) == 1
    assert "skipping checkpoint of step 20" in warnings[0]


def test_truncated_without_digest_is_still_detected(tmp_path):
    save(tmp_path, 10)
    newest = save(tmp_path, 20)
    (tmp_path / "ckpt-00000020.pt.sha256").unlink()
    newest.write_bytes(newest.read_bytes()[:100])
    warnings = []
    path, _ = ckpt.choose_resume("auto", tmp_path, warnings.append)
    assert path.name == "ckpt-00000010.pt"
    assert "unreadable" in warnings[0]


def test_flipped_byte_is_detected_by_the_digest(tmp_path):
    path = save(tmp_path, 3)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match="SHA-256 does not match"):
        ckpt.load_checkpoint(path)


def test_garbage_and_foreign_files_never_crash(tmp_path):
    (tmp_path / "ckpt-00000009.pt").write_bytes(b"not a zip at all")
    torch.save({"weights": torch.zeros(1)}, tmp_path / "ckpt-00000008.pt")
    warnings = []
    assert ckpt.choose_resume("auto", tmp_path, warnings.append) is None
    assert len(warnings) == 2
    assert "keys missing" in warnings[1]


def test_resume_choices(tmp_path):
    save(tmp_path, 4)
    assert ckpt.choose_resume("never", tmp_path, print) is None
    assert ckpt.choose_resume("auto", None, print) is None
    assert ckpt.choose_resume("auto", tmp_path / "empty", print) is None
    path, loaded = ckpt.choose_resume(str(tmp_path / "ckpt-00000004.pt"), tmp_path, print)
    assert (path.name, loaded["step"]) == ("ckpt-00000004.pt", 4)
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        ckpt.choose_resume(str(tmp_path / "ckpt-00000099.pt"), tmp_path, print)


def test_set_aside_moves_checkpoints_out_of_autos_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one_second, real_strftime = time.localtime(1_700_000_000), time.strftime
    monkeypatch.setattr(time, "strftime", lambda fmt: real_strftime(fmt, one_second))  # every call in one second
    save(tmp_path, 4)
    moved = ckpt.set_aside(tmp_path)
    assert moved.name == "superseded-" + real_strftime("%Y%m%dT%H%M%S", one_second)
    assert ckpt.list_checkpoints(tmp_path) == []
    assert sorted(p.name for p in moved.iterdir()) == ["ckpt-00000004.pt", "ckpt-00000004.pt.sha256"]
    assert ckpt.set_aside(tmp_path) is None
    save(tmp_path, 8)  # a second resume=never start within the same second shares the folder
    assert ckpt.set_aside(tmp_path) == moved
    assert [step for step, _ in ckpt.list_checkpoints(moved)] == [4, 8]


def test_cuda_rng_states_are_saved_and_restored_only_where_cuda_is(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda_states = [torch.arange(4, dtype=torch.uint8)]
    restored: list[list[torch.Tensor]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: cuda_states)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    saved = ckpt.rng_state()
    assert saved["cuda"] is cuda_states
    ckpt.set_rng_state(saved)
    assert restored == [cuda_states]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a GPU run's checkpoint resumed on CPUs
    ckpt.set_rng_state(saved)
    assert restored == [cuda_states]
    assert ckpt.rng_state()["cuda"] == []


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    saved = ckpt.rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    ckpt.atomic_save(KEYS | {"rng": [saved]}, tmp_path / "ckpt-00000001.pt")
    loaded = ckpt.load_checkpoint(tmp_path / "ckpt-00000001.pt")["rng"][0]
    random.random(), np.random.rand(), torch.rand(1)
    ckpt.set_rng_state(loaded)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_save_fsyncs_each_file_before_its_rename_and_then_the_directory(tmp_path, monkeypatch):
    events = []
    synced_bytes: dict[str, int] = {}  # what the file held when fsynced: its buffers were flushed first
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        name = str(Path(f"/proc/self/fd/{fd}").readlink())
        events.append(("fsync", name))
        synced_bytes[name] = os.fstat(fd).st_size
        return real_fsync(fd)

    def replace(src: str, dst: str, **kwargs: Any) -> None:
        events.append(("rename", str(src), str(dst)))
        return real_replace(src, dst, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    path = save(tmp_path, 1)
    renames = [(i, e[1]) for i, e in enumerate(events) if e[0] == "rename"]
    assert [events[i][2] for i, _ in renames] == [str(path), str(path) + ".sha256"], events
    for i, tmp in renames:  # the data is on disk before the name points at it
        assert ("fsync", tmp) in events[:i], f"{tmp} renamed without an fsync first: {events}"
        assert synced_bytes[tmp] == Path(events[i][2]).stat().st_size, f"{tmp} fsynced before its last write"
    # the renames themselves are made durable by an fsync of the directory, after the last of them
    assert ("fsync", str(tmp_path)) in events[renames[-1][0] :], events


def test_another_format_version_is_refused_naming_it(tmp_path):
    path = tmp_path / "ckpt-00000001.pt"
    ckpt.atomic_save(KEYS | {"format_version": ckpt.FORMAT_VERSION + 1}, path)
    with pytest.raises(ckpt.CheckpointError, match=rf"format {ckpt.FORMAT_VERSION + 1}, this program reads"):
        ckpt.load_checkpoint(path)


def test_a_checkpoint_that_would_run_pickled_code_is_refused(tmp_path: Path) -> None:
    witness = tmp_path / "code-from-the-checkpoint-ran"

    class Payload:  # unpickling it calls os.mkdir(witness): code from shared storage
        def __reduce__(self) -> tuple:
            return os.mkdir, (str(witness),)

    path = tmp_path / "ckpt-00000001.pt"
    ckpt.atomic_save(KEYS | {"extra": Payload()}, path)
    with pytest.raises(ckpt.CheckpointError, match="unreadable"):
        ckpt.load_checkpoint(path)
    assert not witness.exists()


class Stateful:
    """A scheduler's or optimizer's part in a checkpoint: its state_dict (real ones import torch._dynamo: 1.5 s)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state


def test_what_build_state_assembles_loads_back_whole(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    optimizer_sd = {
        "state": {0: {"momentum_buffer": torch.ones(2, 2)}},
        "param_groups": [{"lr": 0.1, "params": [0, 1]}],
    }
    scheduler = Stateful({"last_epoch": 4, "_last_lr": [0.1]})
    scaler = torch.amp.GradScaler("cpu")
    data = {"epoch": 1, "position": 2, "global_samples_in_epoch": 16}
    loaded = []
    for step, extra in ((5, None), (6, {"loss": 0.5})):
        built = ckpt.build_state(
            step=step,
            model=model,
            optimizer_sd=optimizer_sd,
            scaler=scaler,
            scheduler=scheduler,  # type: ignore[arg-type]
            data_state=data,
            rng_states=[ckpt.rng_state(), ckpt.rng_state()],
            config={"run": {"seed": 3}},
            world_size=2,
            extra=extra,
        )
        ckpt.atomic_save(built, ckpt.checkpoint_path(tmp_path, step))
        loaded.append(ckpt.load_checkpoint(ckpt.checkpoint_path(tmp_path, step)))
    first, second = loaded
    assert first.keys() == {
        *("format_version", "step", "world_size", "model", "optimizer", "scaler", "scheduler", "data", "rng"),
        *("config", "extra"),
    }
    assert (first["format_version"], first["step"], first["world_size"]) == (ckpt.FORMAT_VERSION, 5, 2)
    assert first["model"].keys() == model.state_dict().keys()
    assert all(torch.equal(first["model"][k], v) for k, v in model.state_dict().items())
    assert first["optimizer"]["param_groups"] == optimizer_sd["param_groups"]
    assert torch.equal(first["optimizer"]["state"][0]["momentum_buffer"], torch.ones(2, 2))
    assert (first["scaler"], first["scheduler"]) == (scaler.state_dict(), scheduler.state)
    assert (first["data"], first["config"], len(first["rng"])) == (data, {"run": {"seed": 3}}, 2)
    assert (first["extra"], second["extra"]) == ({}, {"loss": 0.5})


def test_optimizer_state_is_consolidated_on_every_rank_and_kept_on_rank_0() -> None:
    class Sharded(Stateful):  # the shape of ZeroRedundancyOptimizer: consolidate_state_dict is a collective
        def __init__(self, state: dict[str, Any]) -> None:
            super().__init__(state)
            self.consolidated_to: list[int] = []

        def consolidate_state_dict(self, to: int) -> None:
            self.consolidated_to.append(to)

    rank0, rank1 = Sharded({"state": {}, "param_groups": [{"lr": 0.1}]}), Sharded({})
    assert ckpt.optimizer_state(rank0, 0) == {"state": {}, "param_groups": [{"lr": 0.1}]}  # type: ignore[arg-type]
    assert ckpt.optimizer_state(rank1, 1) is None  # type: ignore[arg-type]
    assert rank0.consolidated_to == rank1.consolidated_to == [0]
    plain = Stateful({"state": {}, "param_groups": [{"lr": 0.2}]})  # any other optimizer: no consolidation
    assert ckpt.optimizer_state(plain, 0) == {"state": {}, "param_groups": [{"lr": 0.2}]}  # type: ignore[arg-type]
    assert ckpt.optimizer_state(plain, 1) is None  # type: ignore[arg-type]


def test_to_cpu_is_a_snapshot_that_training_cannot_change():
    live = {"model": {"w": torch.ones(3)}, "optimizer": {"state": {0: {"buf": torch.zeros(2)}}}, "rng": [(1, 2)]}
    snapshot = ckpt.to_cpu(live)
    live["model"]["w"].add_(1)  # an optimizer step, in place
    live["optimizer"]["state"][0]["buf"][0] = 5
    live["rng"].append((3, 4))
    assert snapshot["model"]["w"].tolist() == [1.0] * 3
    assert snapshot["optimizer"]["state"][0]["buf"].tolist() == [0.0, 0.0]
    assert snapshot["rng"] == [(1, 2)]
    module_state = torch.nn.BatchNorm1d(2).state_dict()  # an OrderedDict with the module versions load reads
    copied = ckpt.to_cpu(module_state)
    assert type(copied) is type(module_state) and copied._metadata == module_state._metadata


def test_background_writer_one_write_at_a_time_then_prunes(tmp_path, monkeypatch):
    started, release = threading.Event(), threading.Event()
    real_save = ckpt.atomic_save

    def slow_save(state: dict, path: Path) -> str:
        started.set()
        assert release.wait(10)
        return real_save(state, path)

    writer = ckpt.Writer(keep_last=1, background=True)
    save(tmp_path, 1)
    monkeypatch.setattr(ckpt, "atomic_save", slow_save)
    writer.save(state(2), ckpt.checkpoint_path(tmp_path, 2), {"step": 2})
    assert started.wait(10)
    writer.poll()  # in flight: returns at once
    # a daemon: a write hung on dead shared storage never holds up the exit of a run that failed meanwhile
    assert [t.daemon for t in threading.enumerate() if t.name == "checkpoint-writer"] == [True]
    assert writer.finished == [] and ckpt.list_checkpoints(tmp_path)[-1][0] == 1  # the old one stays meanwhile
    release.set()
    writer.save(state(3), ckpt.checkpoint_path(tmp_path, 3), {"step": 3})  # waits for step 2 first
    writer.wait()
    assert [r["step"] for r in writer.finished] == [2, 3]
    assert all(r["bytes"] > 0 and r["ckpt_write_s"] >= 0 for r in writer.finished)
    assert [step for step, _ in ckpt.list_checkpoints(tmp_path)] == [3]


def test_foreground_writer_has_written_and_pruned_when_save_returns(tmp_path: Path) -> None:
    writer = ckpt.Writer(keep_last=2, background=False)
    for step in (1, 2, 3):
        path = ckpt.checkpoint_path(tmp_path, step)
        began = time.perf_counter()
        writer.save(state(step), path, {"step": step})
        took = time.perf_counter() - began
        assert ckpt.load_checkpoint(path)["step"] == step
        assert writer.finished[-1]["bytes"] == path.stat().st_size
        assert 0 <= writer.finished[-1]["ckpt_write_s"] <= took
    assert [r["step"] for r in writer.finished] == [1, 2, 3]
    assert [step for step, _ in ckpt.list_checkpoints(tmp_path)] == [2, 3]


def test_a_failed_background_write_is_raised_by_the_next_call(tmp_path, monkeypatch):
    def broken_save(state: dict, path: Path) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt, "atomic_save", broken_save)
    writer = ckpt.Writer(keep_last=3, background=True)
    writer.save(state(7), ckpt.checkpoint_path(tmp_path, 7), {"step": 7})
    writer._thread.join()
    with pytest.raises(ckpt.CheckpointError, match=r"ckpt-00000007.pt failed: OSError: .*No space left"):
        writer.poll()
    writer.wait()  # raised once, not again
    writer.save(state(8), ckpt.checkpoint_path(tmp_path, 8), {"step": 8})
    with pytest.raises(ckpt.CheckpointError, match=r"ckpt-00000008\.pt"):
        writer.wait()
    assert writer.finished == []
