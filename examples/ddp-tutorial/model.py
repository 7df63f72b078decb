"""The sibling module main.py imports: a small regression problem with a known answer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.data import TensorDataset


def _dataset(samples: int = 512, features: int = 8) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, features, generator=generator)
    weights = torch.arange(1, features + 1, dtype=torch.float32).unsqueeze(1) / features
    return TensorDataset(inputs, inputs @ weights)


@dataclass
class RegressionTask:
    dataset: TensorDataset = field(default_factory=_dataset)
    model: nn.Module = field(default_factory=lambda: nn.Linear(8, 1))
