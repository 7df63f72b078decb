"""train/checkpoint.py: atomic files, integrity, keep-last-K, choosing the checkpoint to resume from."""

import os
import random
import threading
from pathlib import Path
from typing import Any

import _train_helpers  # noqa: F401  (puts train/ on sys.path; first)
import checkpoint as ckpt
import numpy as np
import pytest
import torch

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
    path = save(tmp_path, 7)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000007.pt", "ckpt-00000007.pt.sha256"]
    digest, name = (tmp_path / "ckpt-00000007.pt.sha256").read_text().split()
    assert name == path.name and len(digest) == 64
    assert ckpt.load_checkpoint(path)["model"]["w"].tolist() == [7.0] * 4
    assert path.stat().st_mode & 0o777 == 0o644


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


def test_set_aside_moves_checkpoints_out_of_autos_way(tmp_path):
    save(tmp_path, 4)
    moved = ckpt.set_aside(tmp_path)
    assert moved.name.startswith("superseded-")
    assert ckpt.list_checkpoints(tmp_path) == []
    assert sorted(p.name for p in moved.iterdir()) == ["ckpt-00000004.pt", "ckpt-00000004.pt.sha256"]
    assert ckpt.set_aside(tmp_path) is None


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
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", str(Path(f"/proc/self/fd/{fd}").readlink())))
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
    # the renames themselves are made durable by an fsync of the directory, after the last of them
    assert ("fsync", str(tmp_path)) in events[renames[-1][0] :], events


def test_another_format_version_is_refused_naming_it(tmp_path):
    path = tmp_path / "ckpt-00000001.pt"
    ckpt.atomic_save(KEYS | {"format_version": ckpt.FORMAT_VERSION + 1}, path)
    with pytest.raises(ckpt.CheckpointError, match=rf"format {ckpt.FORMAT_VERSION + 1}, this program reads"):
        ckpt.load_checkpoint(path)


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
    assert writer.finished == [] and ckpt.list_checkpoints(tmp_path)[-1][0] == 1  # the old one stays meanwhile
    release.set()
    writer.save(state(3), ckpt.checkpoint_path(tmp_path, 3), {"step": 3})  # waits for step 2 first
    writer.wait()
    assert [r["step"] for r in writer.finished] == [2, 3]
    assert all(r["bytes"] > 0 and r["ckpt_write_s"] >= 0 for r in writer.finished)
    assert [step for step, _ in ckpt.list_checkpoints(tmp_path)] == [3]


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
