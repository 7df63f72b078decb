"""ddp_train/data.py and ddp_train/models.py, in one process (no process group needed)."""

import importlib.util
import os
import pickle
import sys
from dataclasses import astuple, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from ddp_train.config import DataConfig, ModelConfig, load_config
from ddp_train.data import (
    ResumableSampler,
    SyntheticImages,
    SyntheticTokens,
    TokenWindows,
    _digits,
    build_datasets,
    build_eval_loader,
    build_stream,
    load_file,
)
from ddp_train.models import ResNet50, build_model, loss_and_correct
from torch.utils.data import DistributedSampler


def batches(stream, n):
    return [stream.next()[1].tolist() for _ in range(n)]


@pytest.mark.parametrize("world_size", [1, 2])
def test_stream_resumed_mid_epoch_continues_the_same_order(world_size):
    cfg = DataConfig(dataset="synthetic", num_samples=40, batch_size=3, image_size=4, channels=1)
    train, _, _ = build_datasets(cfg, seed=0)
    for rank in range(world_size):
        whole = build_stream(train, cfg, rank, world_size, seed=7, cuda=False)
        expected = batches(whole, 20)  # several epochs
        first = build_stream(train, cfg, rank, world_size, seed=7, cuda=False)
        head = batches(first, 9)
        saved = first.state(world_size)
        second = build_stream(train, cfg, rank, world_size, seed=7, cuda=False)
        second.restore(saved, world_size)
        assert head + batches(second, 11) == expected
        assert (second.epoch, first.epoch) != (0, 0)  # crossed epoch boundaries


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_stream_resumed_on_another_world_size_neither_repeats_nor_skips_a_sample(before, after):
    # label == index: the samples themselves. 48 samples, batch 4: 16 taken before the checkpoint, 32 after.
    cfg = DataConfig(dataset="synthetic", num_samples=48, batch_size=4, num_classes=48, image_size=2, channels=1)
    train, _, _ = build_datasets(cfg, seed=0)
    streams = [build_stream(train, cfg, rank, before, seed=5, cuda=False) for rank in range(before)]
    seen = [i for _ in range(16 // (4 * before)) for s in streams for i in s.next()[1].tolist()]
    saved = streams[0].state(before)
    resumed = [build_stream(train, cfg, rank, after, seed=5, cuda=False) for rank in range(after)]
    for stream in resumed:
        stream.restore(saved, after)
    rest = [i for _ in range(32 // (4 * after)) for s in resumed for i in s.next()[1].tolist()]
    assert sorted(seen + rest) == list(range(48)), "the epoch after the resume repeats or skips samples"
    assert {s.epoch for s in resumed} == {0}


def test_stream_takes_full_batches_then_the_next_epochs_shuffle() -> None:
    # label == index: the samples themselves. Rank 1 of 2 holds 20 of the 40: 6 full batches of 3, 2 left over.
    cfg = DataConfig(dataset="synthetic", num_samples=40, batch_size=3, num_classes=40, image_size=2, channels=1)
    train, _, _ = build_datasets(cfg, seed=0)
    stream = build_stream(train, cfg, 1, 2, seed=7, cuda=False)
    orders = []
    for epoch in (0, 1):
        sampler = DistributedSampler(train, num_replicas=2, rank=1, shuffle=True, seed=7)
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    taken = batches(stream, 7)
    assert stream.batches_per_epoch == 6 and all(len(batch) == 3 for batch in taken)
    assert [i for batch in taken[:6] for i in batch] == orders[0][:18]
    assert taken[6] == orders[1][:3]
    assert stream.state(2) == {"epoch": 1, "position": 1, "global_samples_in_epoch": 6}


def test_stream_without_one_full_batch_says_what_to_change() -> None:
    cfg = DataConfig(dataset="synthetic", num_samples=4, batch_size=3, image_size=2, channels=1)
    train, _, _ = build_datasets(cfg, seed=0)
    with pytest.raises(
        RuntimeError, match=r"^the training set yields no full batch: lower data\.batch_size or add data$"
    ):
        build_stream(train, cfg, 0, 2, seed=0, cuda=False).next()  # 2 samples a rank


@pytest.mark.parametrize(("pin_memory", "cuda"), [(True, True), (True, False), (False, True)])
def test_stream_pins_memory_only_when_asked_to_and_on_cuda(pin_memory: bool, cuda: bool) -> None:
    cfg = DataConfig(dataset="synthetic", num_samples=8, batch_size=2, image_size=2, channels=1, pin_memory=pin_memory)
    train, _, _ = build_datasets(cfg, seed=0)
    assert build_stream(train, cfg, 0, 1, seed=0, cuda=cuda).loader.pin_memory is (pin_memory and cuda)


def test_resumable_sampler_skips_start_samples_of_its_next_epoch_only() -> None:
    items = list(range(10))
    whole = list(DistributedSampler(items, num_replicas=2, rank=0, shuffle=True, seed=3))  # type: ignore[arg-type]
    sampler = ResumableSampler(items, num_replicas=2, rank=0, seed=3)  # type: ignore[arg-type]
    assert list(sampler) == whole
    sampler.start = 2
    assert list(sampler) == whole[2:]
    assert list(sampler) == whole


def test_eval_loader_gives_each_held_out_sample_to_one_rank_without_the_global_rng() -> None:
    cfg = DataConfig(dataset="synthetic", num_samples=40, batch_size=4, num_classes=50, image_size=2, channels=1)
    _, held, _ = build_datasets(cfg, seed=0)  # 8 items, labels 40..47 (label == index)
    before = torch.get_rng_state()
    labels = [i for rank in range(3) for _, y in build_eval_loader(held, cfg, rank, 3) for i in y.tolist()]
    assert torch.equal(torch.get_rng_state(), before)  # resumed runs stay bit-identical
    assert sorted(labels) == list(range(40, 48))


def test_epochs_are_reshuffled_and_ranks_disjoint():
    cfg = DataConfig(dataset="synthetic", num_samples=24, batch_size=4, num_classes=24, image_size=2, channels=1)
    train, _, _ = build_datasets(cfg, seed=0)
    streams = [build_stream(train, cfg, rank, 2, seed=0, cuda=False) for rank in range(2)]
    epoch0 = [[i for batch in batches(s, 3) for i in batch] for s in streams]
    epoch1 = [[i for batch in batches(s, 3) for i in batch] for s in streams]
    assert sorted(epoch0[0] + epoch0[1]) == list(range(24))  # label == index here: each sample once
    assert epoch0 != epoch1


@pytest.mark.parametrize(
    ("dataset", "info"), [("synthetic", ("image", 1, 10, 0, 0)), ("synthetic_tokens", ("tokens", 0, 0, 256, 4))]
)
def test_synthetic_held_out_items_are_the_next_items_after_the_training_ones(dataset: str, info: tuple) -> None:
    cfg = DataConfig(dataset=dataset, num_samples=12, eval_fraction=0.25, image_size=2, channels=1, seq_len=4)
    train, held, got_info = build_datasets(cfg, seed=3)
    longer, _, _ = build_datasets(replace(cfg, num_samples=15), seed=3)
    assert (len(train), len(held), astuple(got_info)) == (12, 3, info)
    for i in range(15):
        item = train[i] if i < 12 else held[i - 12]
        assert all(torch.equal(torch.as_tensor(a), torch.as_tensor(b)) for a, b in zip(item, longer[i], strict=True))
    assert build_datasets(replace(cfg, eval_fraction=0.0), seed=3)[1] is None


def test_synthetic_images_are_their_class_prototype_plus_noise_of_their_own() -> None:
    images = SyntheticImages(200, num_classes=4, channels=3, image_size=4, seed=1)
    labels = [images[i][1] for i in range(200)]
    noise = torch.stack([images[i][0] - images.prototypes[labels[i]] for i in range(200)])
    assert labels[:8] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert abs(noise.std().item() - 1.5) < 0.05  # 9600 draws: the standard error is about 0.01
    channels = torch.corrcoef(torch.stack([noise[:, 0].flatten(), noise[:, 1].flatten()]))
    assert abs(channels[0, 1].item()) < 0.1  # every channel its own noise: uncorrelated


def test_synthetic_tokens_are_arithmetic_sequences_with_strides_1_to_7() -> None:
    tokens = SyntheticTokens(100, seq_len=12, vocab_size=97, seed=2)
    strides = set()
    for i in range(len(tokens)):
        x, y = tokens[i]
        assert x.dtype == y.dtype == torch.int64 and torch.equal(x[1:], y[:-1])
        steps = set(((y - x) % 97).tolist())
        assert len(steps) == 1, f"item {i} is not an arithmetic sequence: {x.tolist()}"
        strides |= steps
    assert len(tokens) == 100 and strides == set(range(1, 8))


@pytest.mark.parametrize(("length", "windows"), [(20, 0), (96, 2), (97, 3)])
def test_token_windows_are_whole_and_followed_by_their_next_tokens(length: int, windows: int) -> None:
    text = TokenWindows(torch.arange(length), seq_len=32)
    assert len(text) == windows
    for i in range(windows):
        x, y = text[i]
        assert torch.equal(x, torch.arange(32 * i, 32 * i + 32)) and torch.equal(y, x + 1)


def test_token_text_too_short_for_one_window_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_bytes(b"x" * 40)  # 32 bytes for training: no window of 32 + 1
    with pytest.raises(ValueError, match=r"too short for one window of data\.seq_len=32"):
        build_datasets(DataConfig(dataset="text", root=str(text), seq_len=32), seed=0)


def test_synthetic_is_deterministic_by_seed():
    cfg = DataConfig(dataset="synthetic", num_samples=8, image_size=4)
    a, b, c = (build_datasets(cfg, seed)[0][5][0] for seed in (1, 1, 2))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_digits_ship_with_scikit_learn():
    train, held, info = build_datasets(DataConfig(dataset="digits", eval_fraction=0.2), seed=0)
    assert (len(train), len(held), astuple(info)) == (1438, 359, ("image", 1, 10, 0, 0))
    assert train[0][0].shape == (1, 8, 8)
    train, held, _ = build_datasets(DataConfig(dataset="digits", eval_fraction=0.0), seed=0)
    assert (len(train), held) == (1797, None)


def test_digits_read_directly_equal_load_digits():
    from ddp_train.data import _digits
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    x, y = _digits()
    assert torch.equal(y, torch.from_numpy(labels))
    torch.testing.assert_close(x.reshape(len(y), -1), (torch.from_numpy(images).float() / 16.0 - 0.3) / 0.4)


def test_digits_come_from_the_bundled_csv_not_from_sklearn_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    import sklearn.datasets

    def load_digits(**kwargs: object) -> None:
        raise AssertionError("load_digits called: the bundled CSV was not read directly")

    monkeypatch.setattr(sklearn.datasets, "load_digits", load_digits)
    x, y = _digits()  # every rank of every run: importing sklearn.datasets would cost a second
    assert (x.shape, y.shape) == ((1797, 1, 8, 8), (1797,))


def test_digits_without_the_bundled_csv_come_from_load_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    direct = _digits()
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "sklearn" else real_find_spec(name, *a)
    )
    fallback = _digits()
    assert torch.equal(fallback[0], direct[0]) and torch.equal(fallback[1], direct[1])


def test_folder_of_npy_and_pt_tensors(tmp_path):
    for label, name in enumerate(["cat", "dog"]):
        (tmp_path / name).mkdir()
        for i in range(5):
            np.save(tmp_path / name / f"{i}.npy", np.full((3, 6, 6), label, dtype=np.float32))
        torch.save(torch.full((6, 6), float(label)), tmp_path / name / "extra.pt")
        (tmp_path / name / "README.txt").write_text("ignored")
    cfg = DataConfig(dataset="folder", root=str(tmp_path), eval_fraction=0.25)
    train, held, info = build_datasets(cfg, seed=0)
    assert (len(train) + len(held), info.num_classes, info.channels) == (12, 2, 3)
    image, label = train[0]
    assert image.shape == (3, 6, 6) and float(image.mean()) == label
    assert load_file(tmp_path / "dog" / "extra.pt", 6).shape == (1, 6, 6)


def test_folder_of_images_in_every_supported_format(tmp_path: Path) -> None:
    image_module = pytest.importorskip("PIL.Image")
    for label, name in enumerate(["bright", "dark"]):
        (tmp_path / name).mkdir()
        for suffix in (".png", ".jpg", ".jpeg", ".bmp"):
            image_module.new("L", (8, 6), 255 * (1 - label)).save(tmp_path / name / f"a{suffix}")  # grey, not square
    cfg = DataConfig(dataset="folder", root=str(tmp_path), image_size=4, eval_fraction=0.0)
    train, held, info = build_datasets(cfg, seed=0)
    assert (len(train), held, astuple(info)) == (8, None, ("image", 3, 2, 0, 0))
    for image, label in (train[i] for i in range(8)):
        assert torch.equal(image, torch.full((3, 4, 4), 1.0 - label))  # RGB, channels first, in [0, 1]


def test_folder_of_images_without_pillow_is_refused_and_tensors_need_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL: ImportError
    (tmp_path / "cat").mkdir()
    np.save(tmp_path / "cat" / "0.npy", np.zeros((2, 2), dtype=np.float32))
    cfg = DataConfig(dataset="folder", root=str(tmp_path), eval_fraction=0.0)
    assert len(build_datasets(cfg, seed=0)[0]) == 1
    (tmp_path / "cat" / "1.png").write_bytes(b"")
    with pytest.raises(ValueError, match="holds image files, which need Pillow"):
        build_datasets(cfg, seed=0)


def test_folder_with_train_and_val_dirs_uses_them_as_the_splits(tmp_path: Path) -> None:
    for split, count in (("train", 1), ("val", 2)):
        (tmp_path / "split" / split / "cat").mkdir(parents=True)
        for i in range(count):
            np.save(tmp_path / "split" / split / "cat" / f"{i}.npy", np.zeros((3, 2, 2), dtype=np.float32))
    cfg = DataConfig(dataset="folder", root=str(tmp_path / "split"), eval_fraction=0.5)
    train, held, info = build_datasets(cfg, seed=0)
    assert (len(train), len(held), astuple(info)) == (1, 2, ("image", 3, 1, 0, 0))
    for name in ("cat", "train"):  # without val/ beside it, train/ is a class like any other
        (tmp_path / "classes" / name).mkdir(parents=True)
        np.save(tmp_path / "classes" / name / "0.npy", np.zeros((3, 2, 2), dtype=np.float32))
    _, _, info = build_datasets(replace(cfg, root=str(tmp_path / "classes")), seed=0)
    assert info.num_classes == 2


class Payload:
    """Unpickling it calls os.mkdir(witness): code run from the data directory."""

    def __init__(self, witness: Path) -> None:
        self.witness = witness

    def __reduce__(self) -> tuple:
        return os.mkdir, (str(self.witness),)


def test_folder_files_that_would_run_pickled_code_are_refused(tmp_path: Path) -> None:
    witness = tmp_path / "code-from-the-data-ran"
    np.save(tmp_path / "a.npy", np.array([Payload(witness)], dtype=object), allow_pickle=True)
    torch.save(Payload(witness), tmp_path / "b.pt")
    with pytest.raises(ValueError, match="allow_pickle=False"):
        load_file(tmp_path / "a.npy", 4)
    with pytest.raises(pickle.UnpicklingError):
        load_file(tmp_path / "b.pt", 4)
    assert not witness.exists()


def test_token_datasets(tmp_path):
    train, held, info = build_datasets(DataConfig(dataset="synthetic_tokens", seq_len=16, vocab_size=50), seed=0)
    x, y = train[3]
    assert x.shape == y.shape == (16,) and torch.equal(x[1:], y[:-1]) and astuple(info) == ("tokens", 0, 0, 50, 16)
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(256)) * 4)
    train, held, info = build_datasets(DataConfig(dataset="text", root=str(text), seq_len=32), seed=0)
    assert astuple(info) == ("tokens", 0, 0, 256, 32) and len(train) > 0 and held is not None
    x, y = train[1]
    assert x[0].item() == 32 and y[0].item() == 33


@pytest.mark.parametrize("name", ["small_cnn", "transformer_lm"])
def test_activation_checkpointing_gives_the_same_gradients(name):
    dataset = "synthetic_tokens" if name == "transformer_lm" else "synthetic"
    cfg = load_config(None, [f"model.name={name}", f"data.dataset={dataset}", "model.norm=group"])
    _, _, info = build_datasets(cfg.data, seed=0)
    x = torch.randint(0, 256, (2, 64)) if dataset == "synthetic_tokens" else torch.randn(2, 3, 32, 32)
    y = torch.randint(0, 10, (2, 64) if dataset == "synthetic_tokens" else (2,))
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = build_model(cfg.model, info)
        model.checkpointing = checkpointing
        loss, correct = loss_and_correct(model(x), y)
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        assert 0 <= correct.item() <= y.numel()
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


def test_resnet50_has_the_reference_shape():
    model = ResNet50(in_channels=3, num_classes=1000)
    assert sum(p.numel() for p in model.parameters()) == 25_557_032  # torchvision's resnet50
    assert len(model.blocks) == 3 + 4 + 6 + 3
    with torch.no_grad():
        assert model.eval()(torch.randn(1, 3, 64, 64)).shape == (1, 1000)


def test_build_model_fits_the_data():
    cfg = ModelConfig(name="small_cnn", width=8)
    _, _, info = build_datasets(DataConfig(dataset="digits"), seed=0)
    assert build_model(cfg, info)(torch.randn(4, 1, 8, 8)).shape == (4, 10)
