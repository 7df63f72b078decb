"""Datasets and the sharded, resumable stream of batches each rank trains on.

Image datasets (classification), each item `(float tensor CxHxW, int label)`:
  synthetic  class prototypes plus per-item noise, generated from (seed, index): any size, no storage.
  digits     scikit-learn's bundled 8x8 handwritten digits (1797 images, no download).
  folder     <root>/<class>/<file> with .npy or .pt tensors (CxHxW or HxW), or images when Pillow is
             installed; <root>/train and <root>/val are used as the splits when both exist.
Token datasets (language modelling), each item `(int64 tokens[seq_len], int64 next tokens[seq_len])`:
  synthetic_tokens  arithmetic sequences (start, stride) drawn from (seed, index): learnable, any size.
  text              the bytes of one file, cut into windows (vocabulary 256).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from .config import DataConfig

TENSOR_SUFFIXES = (".npy", ".pt")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
SPLIT_SEED = 12345  # held-out splits do not change with run.seed; pragma: no mutate (any fixed number does)


@dataclass(frozen=True)  # pragma: no mutate (a guard for readers: nothing assigns to one)
class DataInfo:
    kind: str  # "image" or "tokens"
    channels: int = 0
    num_classes: int = 0
    vocab_size: int = 0
    seq_len: int = 0


def _generator(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + index)


class SyntheticImages(Dataset):
    def __init__(
        self, size: int, num_classes: int, channels: int, image_size: int, *, seed: int, offset: int = 0
    ) -> None:
        self.size, self.num_classes, self.seed, self.offset = size, num_classes, seed, offset
        shape = (num_classes, channels, image_size, image_size)
        self.prototypes = torch.randn(shape, generator=_generator(seed, -1))  # pragma: no mutate (no item has it)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        index += self.offset
        label = index % self.num_classes
        noise = torch.randn(self.prototypes.shape[1:], generator=_generator(self.seed, index))
        return self.prototypes[label] + 1.5 * noise, label


class TensorImages(Dataset):
    """In-memory images and labels."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])


class FolderImages(Dataset):
    """Files under <root>/<class>/, loaded lazily."""

    def __init__(self, files: list[Path], labels: list[int], image_size: int) -> None:
        self.files, self.labels, self.image_size = files, labels, image_size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return load_file(self.files[index], self.image_size), self.labels[index]


def load_file(path: Path, image_size: int) -> torch.Tensor:
    if path.suffix == ".npy":
        tensor = torch.from_numpy(np.load(path, allow_pickle=False)).float()
    elif path.suffix == ".pt":
        tensor = torch.load(path, map_location="cpu", weights_only=True).float()
    else:
        from PIL import Image  # only for image folders; Pillow is optional

        with Image.open(path) as image:
            rgb = image.convert("RGB").resize((image_size, image_size))
            tensor = torch.from_numpy(np.asarray(rgb, dtype=np.float32) / 255.0).permute(2, 0, 1)
    return tensor.unsqueeze(0) if tensor.dim() == 2 else tensor


class SyntheticTokens(Dataset):
    def __init__(self, size: int, seq_len: int, vocab_size: int, seed: int, offset: int = 0) -> None:
        self.size, self.seq_len, self.vocab_size, self.seed, self.offset = size, seq_len, vocab_size, seed, offset

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(self.seed, index + self.offset)
        start = int(torch.randint(self.vocab_size, (1,), generator=g))
        stride = int(torch.randint(1, 8, (1,), generator=g))
        tokens = (start + stride * torch.arange(self.seq_len + 1)) % self.vocab_size
        return tokens[:-1], tokens[1:]


class TokenWindows(Dataset):
    """Non-overlapping windows of seq_len + 1 tokens from one long sequence."""

    def __init__(self, tokens: torch.Tensor, seq_len: int) -> None:
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.seq_len)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.tokens[index * self.seq_len : (index + 1) * self.seq_len + 1]
        return chunk[:-1], chunk[1:]


def _split(dataset: Dataset, eval_fraction: float) -> tuple[Dataset, Dataset | None]:
    n = len(dataset)  # type: ignore[arg-type]
    n_eval = int(n * eval_fraction)
    if n_eval == 0:
        return dataset, None
    order = torch.randperm(n, generator=torch.Generator().manual_seed(SPLIT_SEED)).tolist()
    return Subset(dataset, order[n_eval:]), Subset(dataset, order[:n_eval])


def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits: read its bundled CSV directly (importing sklearn.datasets costs a second)."""
    spec = importlib.util.find_spec("sklearn")
    csv = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if csv is not None and csv.is_file():
        raw = np.loadtxt(csv, delimiter=",", dtype=np.float32)  # what load_digits does: 64 pixels, then the label
        images, labels = raw[:, :-1], raw[:, -1]
    else:
        from sklearn.datasets import load_digits

        images, labels = load_digits(return_X_y=True)
    x = torch.from_numpy(images.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    return (x - 0.3) / 0.4, torch.from_numpy(labels.astype(np.int64))


def _folder_files(root: Path) -> tuple[list[Path], list[int], list[str]]:
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    suffixes = TENSOR_SUFFIXES + IMAGE_SUFFIXES
    files, labels = [], []
    for label, name in enumerate(classes):
        for file in sorted((root / name).iterdir()):
            if file.suffix.lower() in suffixes:
                files.append(file)
                labels.append(label)
    if not files:
        raise ValueError(f"data.root={root}: no {', '.join(suffixes)} files under <root>/<class>/")
    if any(f.suffix.lower() in IMAGE_SUFFIXES for f in files):
        try:
            import PIL  # noqa: F401
        except ImportError as exc:
            raise ValueError(f"data.root={root} holds image files, which need Pillow (not installed)") from exc
    return files, labels, classes


def build_datasets(cfg: DataConfig, seed: int) -> tuple[Dataset, Dataset | None, DataInfo]:
    """(train, eval or None, info) for cfg.dataset."""
    n_eval = int(cfg.num_samples * cfg.eval_fraction)
    if cfg.dataset == "synthetic":
        args = (cfg.num_classes, cfg.channels, cfg.image_size)
        train = SyntheticImages(cfg.num_samples, *args, seed=seed)
        held = SyntheticImages(n_eval, *args, seed=seed, offset=cfg.num_samples) if n_eval else None
        return train, held, DataInfo("image", cfg.channels, cfg.num_classes)
    if cfg.dataset == "digits":
        train, held = _split(TensorImages(*_digits()), cfg.eval_fraction)
        return train, held, DataInfo("image", 1, 10)
    if cfg.dataset == "folder":
        root = Path(str(cfg.root))
        if (root / "train").is_dir() and (root / "val").is_dir():
            files, labels, classes = _folder_files(root / "train")
            val_files, val_labels, _ = _folder_files(root / "val")
            train, held = (
                FolderImages(files, labels, cfg.image_size),
                FolderImages(val_files, val_labels, cfg.image_size),
            )
        else:
            files, labels, classes = _folder_files(root)
            train, held = _split(FolderImages(files, labels, cfg.image_size), cfg.eval_fraction)
        channels = load_file(files[0], cfg.image_size).shape[0]
        return train, held, DataInfo("image", channels, len(classes))
    if cfg.dataset == "synthetic_tokens":
        train = SyntheticTokens(cfg.num_samples, cfg.seq_len, cfg.vocab_size, seed)
        held = SyntheticTokens(n_eval, cfg.seq_len, cfg.vocab_size, seed, cfg.num_samples) if n_eval else None
        return train, held, DataInfo("tokens", vocab_size=cfg.vocab_size, seq_len=cfg.seq_len)
    raw = torch.from_numpy(np.fromfile(str(cfg.root), dtype=np.uint8).astype(np.int64))  # text
    cut = int(len(raw) * (1.0 - cfg.eval_fraction))
    train, held = TokenWindows(raw[:cut], cfg.seq_len), TokenWindows(raw[cut:], cfg.seq_len)
    if len(train) == 0:
        raise ValueError(f"data.root={cfg.root}: too short for one window of data.seq_len={cfg.seq_len} + 1 bytes")
    return train, (held if len(held) else None), DataInfo("tokens", vocab_size=256, seq_len=cfg.seq_len)


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can start its next epoch part-way in (`start`: samples of this rank to skip)."""

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        start, self.start = self.start, 0
        return iter(indices[start:])


class BatchStream:
    """Endless batches for one rank, epoch after epoch (set_epoch each time), resumable mid-epoch.

    `position` counts the batches this rank has taken from the current epoch.
    """

    def __init__(self, loader: DataLoader, sampler: ResumableSampler, epoch: int = 0, position: int = 0) -> None:
        self.loader, self.sampler = loader, sampler
        self.epoch, self.position = epoch, position
        self._it: Iterator[Any] | None = None

    @property
    def batches_per_epoch(self) -> int:
        return len(self.loader)

    def _begin_epoch(self) -> None:
        self.sampler.set_epoch(self.epoch)
        self.sampler.start = self.position * int(self.loader.batch_size or 1)
        self._it = iter(self.loader)

    def next(self) -> Any:
        for _ in range(2):  # the current epoch, else the next one; pragma: no mutate (a third finds nothing new)
            if self._it is None:
                self._begin_epoch()
            try:
                batch = next(self._it)  # type: ignore[arg-type]
            except StopIteration:
                self.epoch, self.position, self._it = self.epoch + 1, 0, None
                continue
            self.position += 1
            return batch
        raise RuntimeError("the training set yields no full batch: lower data.batch_size or add data")

    def state(self, world_size: int) -> dict[str, int]:
        samples = self.position * int(self.loader.batch_size or 1) * world_size
        return {"epoch": self.epoch, "position": self.position, "global_samples_in_epoch": samples}

    def restore(self, state: dict[str, int], world_size: int) -> None:
        """Continue after state; a different world size resumes at the same share of the epoch."""
        self.epoch = int(state["epoch"])
        per_step = int(self.loader.batch_size or 1) * world_size
        self.position = int(state["global_samples_in_epoch"]) // per_step
        self._it = None


def build_stream(train: Dataset, cfg: DataConfig, rank: int, world_size: int, *, seed: int, cuda: bool) -> BatchStream:
    sampler = ResumableSampler(train, world_size, rank, seed)
    loader = DataLoader(
        train,
        batch_size=cfg.batch_size,
        sampler=sampler,
        num_workers=cfg.num_workers,
        pin_memory=cfg.pin_memory and cuda,
        persistent_workers=cfg.persistent_workers,
        drop_last=True,  # equal, full batches on every rank
        generator=torch.Generator().manual_seed(seed),
    )
    return BatchStream(loader, sampler)


def build_eval_loader(held: Dataset, cfg: DataConfig, rank: int, world_size: int) -> DataLoader:
    """This rank's share of the eval split (every sample exactly once across ranks; no collectives inside)."""
    shard = Subset(held, list(range(rank, len(held), world_size)))  # type: ignore[arg-type]
    # Its own generator: iterating must not draw from the global RNG (resumed runs stay bit-identical).
    return DataLoader(shard, batch_size=cfg.batch_size, num_workers=0, generator=torch.Generator())
