"""ResNet workloads: torchvision's ResNet50 (the paper's vision model) and a tiny ResNet for tests."""
from __future__ import annotations

import torch
import torchvision
from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet


def _resnet_tiny() -> nn.Module:
    return ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10)  # ResNet-10: 4.9 M parameters


MODELS = {
    "resnet50": lambda: torchvision.models.resnet50(weights=None),  # 25.6 M parameters, random init
    "resnet-tiny": _resnet_tiny,
}


def num_classes(model: nn.Module) -> int:
    """Number of output classes of a torchvision ResNet."""
    return model.fc.out_features


def make_batch(model: nn.Module, batch_size: int, image_size: int, seq_len: int, generator: torch.Generator) -> dict:
    """Random images and labels (seq_len is unused here)."""
    return {
        "images": torch.randn(batch_size, 3, image_size, image_size, generator=generator),
        "labels": torch.randint(0, num_classes(model), (batch_size,), generator=generator),
    }


def loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """Cross-entropy of the classifier."""
    return nn.functional.cross_entropy(model(batch["images"]), batch["labels"])
