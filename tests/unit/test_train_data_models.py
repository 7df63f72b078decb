"""train/data.py and train/models.py, in one process (no process group needed)."""

import _train_helpers  # noqa: F401  (puts train/ on sys.path; first)
import numpy as np
import pytest
import torch
from config import DataConfig, ModelConfig, load_config
from data import build_datasets, build_stream, load_file
from models import ResNet50, build_model, loss_and_correct


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


def test_epochs_are_reshuffled_and_ranks_disjoint():
    cfg = DataConfig(dataset="synthetic", num_samples=24, batch_size=4, num_classes=24, image_size=2, channels=1)
    train, _, _ = build_datasets(cfg, seed=0)
    streams = [build_stream(train, cfg, rank, 2, seed=0, cuda=False) for rank in range(2)]
    epoch0 = [[i for batch in batches(s, 3) for i in batch] for s in streams]
    epoch1 = [[i for batch in batches(s, 3) for i in batch] for s in streams]
    assert sorted(epoch0[0] + epoch0[1]) == list(range(24))  # label == index here: each sample once
    assert epoch0 != epoch1


def test_synthetic_is_deterministic_by_seed():
    cfg = DataConfig(dataset="synthetic", num_samples=8, image_size=4)
    a, b, c = (build_datasets(cfg, seed)[0][5][0] for seed in (1, 1, 2))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_digits_ship_with_scikit_learn():
    train, held, info = build_datasets(DataConfig(dataset="digits", eval_fraction=0.2), seed=0)
    assert (len(train), len(held), info.channels, info.num_classes) == (1438, 359, 1, 10)
    assert train[0][0].shape == (1, 8, 8)


def test_digits_read_directly_equal_load_digits():
    from data import _digits
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    x, y = _digits()
    assert torch.equal(y, torch.from_numpy(labels))
    torch.testing.assert_close(x.reshape(len(y), -1), (torch.from_numpy(images).float() / 16.0 - 0.3) / 0.4)


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


def test_token_datasets(tmp_path):
    train, held, info = build_datasets(DataConfig(dataset="synthetic_tokens", seq_len=16, vocab_size=50), seed=0)
    x, y = train[3]
    assert x.shape == y.shape == (16,) and torch.equal(x[1:], y[:-1]) and info.vocab_size == 50
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(256)) * 4)
    train, held, info = build_datasets(DataConfig(dataset="text", root=str(text), seq_len=32), seed=0)
    assert info.vocab_size == 256 and len(train) > 0 and held is not None
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
