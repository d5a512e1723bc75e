"""An example of your own workload for ddpbench: a small convolutional classifier.

    ./ddpbench run --model examples/my_model.py --world-size 2 --image-size 32 --out /tmp/mine.jsonl
    ./ddpbench run --model examples/my_model.py --model-config width=64,depth=4 ...   # build_model's arguments
    ./ddpbench advise --model examples/my_model.py --image-size 32

A workload is three functions; ddpbench wraps the model in DDP, moves the batch to each rank's device,
and times forward (`loss`), backward and the optimizer step. Anything else in the file is yours.
"""
import torch
from torch import nn


def build_model(width: int = 32, depth: int = 3, classes: int = 10) -> nn.Module:
    """The model, with random weights; `--model-config key=value,...` arrives here as keyword arguments."""
    layers, channels = [], 3
    for _ in range(depth):
        layers += [nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
        channels = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes))


def make_batch(model: nn.Module, batch_size: int, image_size: int, seq_len: int, generator: torch.Generator) -> dict:
    """One synthetic batch per rank, made on the CPU from `generator` (ddpbench reuses it every iteration)."""
    classes = model[-1].out_features
    return {"images": torch.randn(batch_size, 3, image_size, image_size, generator=generator),
            "labels": torch.randint(0, classes, (batch_size,), generator=generator)}


def loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """The scalar loss of one forward; `model` is the DDP wrapper, called like the module itself."""
    return nn.functional.cross_entropy(model(batch["images"]), batch["labels"])
