"""What `--model` names: a built-in workload, `torchvision:NAME`, `transformers:TYPE`, or the user's own
workload as a file `path/to/file.py` or a module `package.module`.

Every kind resolves to one `Workload`: `build()` makes the model (random weights, nothing downloaded),
`make_batch(model, batch_size, image_size, seq_len, generator)` a synthetic batch on the CPU, and
`loss(model, batch)` the scalar training loss - the same three things each built-in workload file offers.
`check` answers, before any process starts, whether a spec can be built (a ValueError naming what is
wrong otherwise); `load` builds the Workload in a rank.
"""
from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

TORCHVISION, TRANSFORMERS = "torchvision:", "transformers:"
MODEL_HELP = "torchvision:NAME, transformers:TYPE, path/to/file.py or package.module (README 'Your own model')"


@dataclass(frozen=True)
class Workload:
    """A model builder, a batch maker and a loss, resolved from a `--model` spec."""

    spec: str
    build: Callable[[], nn.Module]
    make_batch: Callable[..., dict]
    loss: Callable[[nn.Module, dict], torch.Tensor]
    source_hash: str = ""  # sha256 of the user's file (its first 16 hex digits); "" for library models


def kind(spec: str) -> str:
    """`builtin`, `torchvision`, `transformers` or `user` (a file or a module of the user's)."""
    from . import WORKLOADS

    if spec in WORKLOADS:
        return "builtin"
    if spec.startswith(TORCHVISION):
        return "torchvision"
    if spec.startswith(TRANSFORMERS):
        return "transformers"
    return "user"


def parse_model_config(text: str) -> dict[str, str]:
    """`key=value,key=value` into raw strings; a comma inside brackets or quotes does not split a value."""
    if not text.strip():
        return {}
    pairs = {}
    # Split only at commas that start a new `key=`: values such as `[2,2,6,2]` keep their commas.
    for item in re.split(r",(?=\s*[A-Za-z_][\w.]*\s*=)", text):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"--model-config: {item.strip()!r} is not key=value (pairs are separated by commas)")
        if key.strip() in pairs:
            raise ValueError(f"--model-config: {key.strip()!r} is given twice")
        pairs[key.strip()] = value.strip()
    return pairs


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


def check(spec: str, model_config: str = "", image_size: int = 64, seq_len: int = 32) -> dict:
    """Raise ValueError, naming the problem, unless `spec` (with `model_config`) can be built; return what
    is known before building: `parameters` (from a build on the meta device, None where that is not
    possible) and `source_hash` (the user's file)."""
    what = kind(spec)
    if what == "builtin":
        if model_config.strip():
            raise ValueError(f"--model-config applies to torchvision:, transformers: and user models, not to the "
                             f"built-in {spec!r}")
        return {"parameters": None, "source_hash": ""}
    return _module_for(what).check(spec, parse_model_config(model_config), image_size, seq_len)


@functools.lru_cache(maxsize=8)
def load(spec: str, model_config: str = "", image_size: int = 64, seq_len: int = 32,
         expected_hash: str = "") -> Workload:
    """The Workload `spec` names (checked as `check` does); with `expected_hash`, the user's file must
    still have that content (a file edited during a sweep must not be measured under the old label)."""
    what = kind(spec)
    if what == "builtin":
        from . import workload

        family = workload(spec)
        return Workload(spec, family.MODELS[spec], family.make_batch, family.loss)
    loaded = _module_for(what).load(spec, parse_model_config(model_config), image_size, seq_len)
    if expected_hash and loaded.source_hash != expected_hash:
        raise ValueError(f"--model={spec!r} changed since the sweep started (sha256 {loaded.source_hash}, "
                         f"recorded as {expected_hash}); run it again")
    return loaded


def _module_for(what: str):
    from . import torchvision_any, transformers_any, user_file

    return {"torchvision": torchvision_any, "transformers": transformers_any, "user": user_file}[what]


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
