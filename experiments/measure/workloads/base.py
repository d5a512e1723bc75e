"""What every kind of workload shares: the `Workload` record (a model builder, a batch maker and a loss),
the conversion of `--model-config` values, the model's size, and the dry run on the meta device that
checks a model before any rank starts. A leaf module: the kinds (torchvision_any, transformers_any,
user_file) build on it, and spec.py resolves a `--model` to one of them."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

TORCHVISION, TRANSFORMERS = "torchvision:", "transformers:"


@dataclass(frozen=True)
class Workload:
    """A model builder, a batch maker and a loss, resolved from a `--model` spec."""

    spec: str
    build: Callable[[], nn.Module]
    make_batch: Callable[..., dict]
    loss: Callable[[nn.Module, dict], torch.Tensor]
    source_hash: str = ""  # sha256 of the user's file (its first 16 hex digits); "" for library models


def convert(key: str, raw: str, default=None):
    """`raw` as the type of `default` (bool, int, float, str); otherwise a Python literal, else the text."""
    def fail(kind_name):
        return ValueError(f"--model-config {key}={raw!r} is not a valid {kind_name} (the default is {default!r})")

    if isinstance(default, bool):
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise fail("bool (true or false)")
    if isinstance(default, (int, float)):
        try:
            number = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            raise fail(type(default).__name__) from None
        if isinstance(default, int) and not (isinstance(number, int) or (isinstance(number, float) and number.is_integer())):
            raise fail("int")
        if not isinstance(number, (int, float)) or isinstance(number, bool):
            raise fail(type(default).__name__)
        return type(default)(number)
    if isinstance(default, str):
        return raw
    try:  # None, lists, tuples, dicts: whatever the text spells, else the text itself
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def model_size(model: nn.Module) -> dict:
    """Parameters (all and trainable) and the bytes of the gradients DDP reduces per iteration."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return {"parameters": sum(p.numel() for p in model.parameters()),
            "trainable_parameters": sum(p.numel() for p in trainable),
            "gradient_bytes": sum(p.numel() * p.element_size() for p in trainable),
            "gradient_tensors": len(trainable)}


def dry_run(workload: Workload, image_size: int, seq_len: int) -> int | None:
    """Build the model and run its loss on a batch of 2 on the meta device (shapes only: no memory, no
    time), so that a model that cannot take these inputs fails before any rank starts. Returns the
    parameter count, or None where the model cannot be built on the meta device (an initialiser that
    reads values); where only the forward has no meta kernel, it is not checked. Other errors propagate."""
    try:
        with torch.device("meta"):
            model = workload.build()
    except NotImplementedError:
        return None
    parameters = sum(p.numel() for p in model.parameters())
    batch = workload.make_batch(model, 2, image_size, seq_len, torch.Generator().manual_seed(0))
    try:
        workload.loss(model, {k: v.to("meta") for k, v in batch.items()})
    except NotImplementedError:
        pass  # an operator without a meta kernel: the ranks will find out
    except RuntimeError as error:
        if "meta" not in str(error):  # e.g. `.item()` on a meta tensor: a value the check cannot know
            raise
    return parameters
