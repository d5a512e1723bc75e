"""What every kind of workload shares: the `Workload` record (a model builder, a batch maker and a loss),
the conversion of `--model-config` values, the model's size, and the dry run on the meta device that
checks a model before any rank starts. A leaf module: the kinds (torchvision_any, transformers_any,
user_file) build on it, and spec.py resolves a `--model` to one of them."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from experiments.measure.workloads import TORCHVISION, TRANSFORMERS  # noqa: F401 (the kinds import them from here)
# What the harness does with a workload's functions (harness.build, harness.train_step): it calls
# `.to(device)` on every value of the batch and `.backward()` on the loss.
MAKE_BATCH_CONTRACT = ("make_batch(model, batch_size, image_size, seq_len, generator) -> dict of str -> torch.Tensor "
                       "(on the CPU)")
LOSS_CONTRACT = "loss(model, batch) -> scalar torch.Tensor (one element, with a gradient to the model's parameters)"


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


def dry_run(workload: Workload, image_size: int, seq_len: int, user_code: bool = False) -> int | None:
    """Build the model and run its loss on a batch of 2 on the meta device (shapes only: no memory, no
    time), so that a model that cannot take these inputs, or a batch or loss of the wrong kind, fails
    before any rank starts (ValueError quoting the contract for the latter). Returns the parameter count,
    or None where the model cannot be built on the meta device (an initialiser that reads values); where
    only the forward has no meta kernel, it is not checked. Other errors propagate, except, with
    `user_code` (a user's file), those its own functions raise on the meta device: that code may need
    real values or a device, and the ranks report its errors; what it returns is checked all the same."""
    try:
        with torch.device("meta"):
            model = workload.build()
    except NotImplementedError:
        return None
    except Exception:
        if user_code:
            return None
        raise
    parameters = sum(p.numel() for p in model.parameters())
    try:
        batch = workload.make_batch(model, 2, image_size, seq_len, torch.Generator().manual_seed(0))
    except Exception:
        if user_code:
            return parameters
        raise
    check_batch(workload.spec, batch)
    try:
        value = workload.loss(model, {k: v.to("meta") for k, v in batch.items()})
    except NotImplementedError:
        return parameters  # an operator without a meta kernel: the ranks will find out
    except RuntimeError as error:
        if "meta" in str(error) or user_code:  # e.g. `.item()` on a meta tensor: a value the check cannot know
            return parameters
        raise
    except Exception:
        if user_code:
            return parameters
        raise
    check_loss(workload.spec, value)
    return parameters


def check_batch(spec: str, batch) -> None:
    """ValueError, quoting the contract, unless `batch` is a dict of str -> torch.Tensor."""
    if not isinstance(batch, dict):
        raise ValueError(f"--model={spec!r}: make_batch returned {_kind(batch)}, not a dict; the contract is "
                         f"{MAKE_BATCH_CONTRACT} (docs/your-model.md)")
    for key, value in batch.items():
        if not isinstance(key, str):
            raise ValueError(f"--model={spec!r}: make_batch returned a dict with the key {key!r}, not a str; the "
                             f"contract is {MAKE_BATCH_CONTRACT} (docs/your-model.md)")
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"--model={spec!r}: make_batch returned a dict whose {key!r} is {_kind(value)}, not a "
                             f"torch.Tensor; the contract is {MAKE_BATCH_CONTRACT} (docs/your-model.md)")


def check_loss(spec: str, value) -> None:
    """ValueError, quoting the contract, unless `value` is a one-element tensor that has a gradient."""
    if not isinstance(value, torch.Tensor):
        problem = f"{_kind(value)}, not a torch.Tensor"
    elif value.numel() != 1:
        problem = f"a tensor of shape {tuple(value.shape)}, not a scalar (reduce it, e.g. with .mean())"
    elif not value.requires_grad:
        problem = "a tensor without a gradient (it does not depend on the model's parameters)"
    else:
        return
    raise ValueError(f"--model={spec!r}: loss returned {problem}; the contract is {LOSS_CONTRACT} "
                     "(docs/your-model.md)")


def _kind(value) -> str:
    """`None`, `a list`, `a numpy.ndarray`: what a value is, in a message."""
    if value is None:
        return "None"
    kind = type(value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def blame(overrides: dict[str, str], error: BaseException) -> str:
    """The `--model-config key=value` pairs whose value the text of `error` names (all of them where it
    names none): which of the user's settings a failed build points at."""
    text = f"{error!r} {error}"
    named = {key: raw for key, raw in overrides.items()
             if re.search(rf"(?<![\w.]){re.escape(raw)}(?![\w.])", text)}
    return ",".join(f"{key}={raw!r}" for key, raw in (named or overrides).items())
