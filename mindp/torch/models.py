"""The torch models of `make run MODEL=...` and their data, as pure functions of (config, worker, step).

- `cnn`: a small convolutional net on the 8x8 digits (`mindp/data/digits.csv.gz`, no download);
- `gpt`: a small decoder-only transformer, byte-level, on scikit-learn's dataset descriptions
  (`mindp/data/corpus.txt`, English text, 43 kB).

Parameters are built from the seed (torch's generator seeded per model), the batches of worker
w at step s from a numpy generator seeded with (seed, w, s) inside w's own shard, and torch runs
single-threaded, so every worker process and the single-process reference compute the same bits.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mindp.dataset import DATA_DIR

from .parallel import trained

TORCH_MODELS = ("cnn", "gpt")


def deterministic() -> None:
    """One thread: a product split across threads may be summed in another order."""
    torch.set_num_threads(1)


class Cnn(nn.Module):
    def __init__(self, channels: int = 16):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels // 2, 3, padding=1)
        self.conv2 = nn.Conv2d(channels // 2, channels, 3, padding=1)
        self.fc = nn.Linear(channels * 16, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


@dataclass(frozen=True)
class GptSpec:
    d: int = 160
    layers: int = 4
    heads: int = 4
    ctx: int = 64
    vocab: int = 256  # bytes


class Block(nn.Module):
    def __init__(self, s: GptSpec):
        super().__init__()
        self.heads = s.heads
        self.ln1 = nn.LayerNorm(s.d)
        self.qkv = nn.Linear(s.d, 3 * s.d)
        self.proj = nn.Linear(s.d, s.d)
        self.ln2 = nn.LayerNorm(s.d)
        self.fc1 = nn.Linear(s.d, 4 * s.d)
        self.fc2 = nn.Linear(4 * s.d, s.d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, s: GptSpec):
        super().__init__()
        self.tok = nn.Embedding(s.vocab, s.d)
        self.pos = nn.Embedding(s.ctx, s.d)
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.layers))
        self.ln = nn.LayerNorm(s.d)
        self.head = nn.Linear(s.d, s.vocab, bias=False)
        for p in self.parameters():  # GPT-2's initialisation: N(0, 0.02), zero biases, unit norms
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)
        for blk in self.blocks:
            nn.init.normal_(blk.proj.weight, std=0.02 / math.sqrt(2 * s.layers))
            nn.init.normal_(blk.fc2.weight, std=0.02 / math.sqrt(2 * s.layers))

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def build(name: str, args: dict, seed: int) -> nn.Module:
    """The model `name` with its float32 parameters initialised from `seed`."""
    torch.manual_seed(seed)
    if name == "cnn":
        return Cnn(**args)
    if name == "gpt":
        return Gpt(GptSpec(**args))
    raise ValueError(f"unknown torch model {name!r}: choose one of {', '.join(TORCH_MODELS)}")


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@functools.lru_cache(maxsize=2)
def corpus() -> np.ndarray:
    """The text corpus as bytes (uint8)."""
    return np.frombuffer((DATA_DIR / "corpus.txt").read_bytes(), dtype=np.uint8)


def text_split(test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    text = corpus()
    cut = int(len(text) * (1 - test_fraction))
    return text[:cut], text[cut:]


def text_batch(text: np.ndarray, starts: np.ndarray, ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts[:, None] + np.arange(ctx + 1)
    win = torch.from_numpy(text[idx].astype(np.int64))
    return win[:, :-1], win[:, 1:]


def loss_of(name: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    if name == "gpt":
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return F.cross_entropy(out, y)


def load_params(model: nn.Module, params: dict) -> None:
    """Write named (fp16) arrays into the module's float32 trained parameters (frozen ones stay)."""
    with torch.no_grad():
        for name, p in trained(model):
            p.copy_(torch.from_numpy(np.asarray(params[name], dtype=np.float32)))
