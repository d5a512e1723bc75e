"""Tiny models and batches for the correctness tests, plus a local (single-process) reference trainer.

Every builder is seeded, so each rank, and the reference, construct identical weights.
"""
from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """Conv + BatchNorm + linear: BatchNorm buffers must be broadcast from rank 0."""

    def __init__(self):
        super().__init__()
        # No conv bias: BatchNorm cancels it, so its gradient is rounding noise that Adam would amplify.
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


class FrozenStem(nn.Module):
    """A frozen first layer (requires_grad=False) under trainable ones."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(6, 16)
        self.stem.requires_grad_(False)
        self.body = nn.Sequential(nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 5))

    def forward(self, x):
        return self.body(self.stem(x))


class Branchy(nn.Module):
    """Rank-dependent routing: `route` picks a branch, and `never` is unused on every rank."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(6, 12)
        self.branches = nn.ModuleList([nn.Linear(12, 5), nn.Linear(12, 5)])
        self.never = nn.Linear(12, 5)

    def forward(self, x, route: int = 0):
        return self.branches[route](torch.relu(self.trunk(x)))


def tiny_bert():
    """A 2-layer BERT for masked LM from transformers' BertConfig; output embeddings tied to input."""
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        tie_word_embeddings=True,
    )
    return BertForMaskedLM(config)


def build(name: str) -> nn.Module:
    """Build one of the test models with fixed weights."""
    torch.manual_seed(1234)
    builders = {"cnn_bn": SmallCNN, "frozen": FrozenStem, "branchy": Branchy, "bert": tiny_bert}
    return builders[name]()


def make_batch(name: str, rank: int, step: int, size: int = 4) -> dict:
    """The batch `rank` trains on at `step`: distinct per rank and step, reproducible anywhere."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    if name == "cnn_bn":
        return {"x": torch.randn(size, 3, 6, 6, generator=g), "y": torch.randint(0, 5, (size,), generator=g)}
    if name == "bert":
        ids = torch.randint(0, 64, (size, 8), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}
    batch = {"x": torch.randn(size, 6, generator=g), "y": torch.randint(0, 5, (size,), generator=g)}
    if name == "branchy":
        batch["route"] = rank % 2  # rank 0 uses branch 0, rank 1 branch 1, ...
    return batch


def loss_of(model: nn.Module, name: str, batch: dict) -> torch.Tensor:
    """Mean loss of `model` on `batch` (works on the bare module and on any DDP wrapper)."""
    if name == "bert":
        return model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
    if name == "branchy":
        out = model(batch["x"], route=batch["route"])
    else:
        out = model(batch["x"])
    return nn.functional.cross_entropy(out, batch["y"])


def make_optimizer(kind: str, params) -> torch.optim.Optimizer:
    """SGD with momentum or Adam, the two optimizers the equivalence tests train with."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


def train_locally(name: str, optimizer_kind: str, world_size: int, steps: int) -> nn.Module:
    """Single-process training that DDP over `world_size` ranks must equal.

    The loss is the mean over ranks of each rank's mean loss. BatchNorm normalises over each rank's
    own batch under DDP (batch statistics are not synchronised), so the shards go through the model
    one at a time; for models without BatchNorm this is exactly training on the concatenated batch.
    """
    model = build(name)
    optimizer = make_optimizer(optimizer_kind, [p for p in model.parameters() if p.requires_grad])
    for step in range(steps):
        optimizer.zero_grad()
        loss = sum(loss_of(model, name, make_batch(name, r, step)) for r in range(world_size)) / world_size
        loss.backward()
        optimizer.step()
    return model
