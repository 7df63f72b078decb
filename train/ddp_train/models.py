"""The models, in plain torch.nn: a small ResNet-style CNN, ResNet-50, and a small transformer language model.

Every model keeps its repeated blocks in `self.blocks` and runs them through `run_blocks`, which wraps each in
torch.utils.checkpoint when activation checkpointing is on (the parameter names do not change with it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config import ModelConfig
from .data import DataInfo


def run_blocks(blocks: nn.ModuleList, x: torch.Tensor, checkpointing: bool) -> torch.Tensor:
    for block in blocks:
        x = checkpoint(block, x, use_reentrant=False) if checkpointing and torch.is_grad_enabled() else block(x)
    return x


def _norm(kind: str, channels: int) -> nn.Module:
    return nn.BatchNorm2d(channels) if kind == "batch" else nn.GroupNorm(min(8, channels), channels)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, norm: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n1 = _norm(norm, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.n2 = _norm(norm, cout)
        self.shortcut = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _norm(norm, cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.n1(self.conv1(x)))
        return F.relu(self.n2(self.conv2(out)) + self.shortcut(x))


class SmallCNN(nn.Module):
    """Stem, then 2 stages of basic residual blocks (the second at half resolution, twice the width)."""

    def __init__(self, in_channels: int, num_classes: int, width: int, blocks_per_stage: int, norm: str) -> None:
        super().__init__()
        self.checkpointing = False
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), _norm(norm, width), nn.ReLU())
        blocks: list[nn.Module] = []
        for stage, cout in enumerate((width, 2 * width)):
            for i in range(blocks_per_stage):
                cin = cout if i else width
                blocks.append(BasicBlock(cin, cout, 2 if stage and not i else 1, norm))
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = run_blocks(self.blocks, self.stem(x), self.checkpointing)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        cout = planes * self.expansion
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        nn.init.zeros_(self.bn3.weight)  # each residual branch starts as identity
        self.downsample = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + self.downsample(x))


class ResNet50(nn.Module):
    """ResNet-50 (bottleneck blocks [3, 4, 6, 3]), the torchvision layout without torchvision."""

    def __init__(self, in_channels: int, num_classes: int, layers: tuple[int, ...] = (3, 4, 6, 3)) -> None:
        super().__init__()
        self.checkpointing = False
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks: list[nn.Module] = []
        cin = 64
        for stage, (planes, count) in enumerate(zip((64, 128, 256, 512), layers, strict=True)):
            for i in range(count):
                blocks.append(Bottleneck(cin, planes, 2 if stage and not i else 1))
                cin = planes * Bottleneck.expansion
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = run_blocks(self.blocks, self.stem(x), self.checkpointing)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class DecoderBlock(nn.Module):
    """Pre-norm causal self-attention and MLP."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        attn = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + F.dropout(self.proj(attn.transpose(1, 2).reshape(b, t, d)), p, self.training)
        return x + self.mlp(self.ln2(x))


class TransformerLM(nn.Module):
    def __init__(self, vocab_size: int, seq_len: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.checkpointing = False
        self.tok = nn.Embedding(vocab_size, cfg.d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, cfg.d_model))
        nn.init.normal_(self.pos, std=0.02)
        self.blocks = nn.ModuleList(
            DecoderBlock(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout) for _ in range(cfg.n_layers)
        )
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos[:, : tokens.shape[1]]
        return self.head(self.ln(run_blocks(self.blocks, x, self.checkpointing)))


def build_model(cfg: ModelConfig, info: DataInfo) -> nn.Module:
    model: nn.Module
    if cfg.name == "small_cnn":
        model = SmallCNN(info.channels, info.num_classes, cfg.width, cfg.blocks_per_stage, cfg.norm)
    elif cfg.name == "resnet50":
        model = ResNet50(info.channels, info.num_classes)
    else:
        model = TransformerLM(info.vocab_size, info.seq_len, cfg)
    model.checkpointing = cfg.activation_checkpointing
    return model


def loss_and_correct(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy and the number of correct predictions; (B, C) or (B, T, V) logits alike."""
    flat = logits.flatten(0, -2).float()
    labels = target.flatten()
    return F.cross_entropy(flat, labels), (flat.argmax(-1) == labels).sum()
