"""What `--model` names: a built-in workload, `torchvision:NAME`, `transformers:TYPE`, or the user's own
workload as a file `path/to/file.py` or a module `package.module`.

Every kind resolves to one `Workload`: `build()` makes the model (random weights, nothing downloaded),
`make_batch(model, batch_size, image_size, seq_len, generator)` a synthetic batch on the CPU, and
`loss(model, batch)` the scalar training loss - the same three things each built-in workload file offers.
`check` answers, before any process starts, whether a spec can be built (a ValueError naming what is
wrong otherwise); `load` builds the Workload in a rank.
"""
from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

from experiments.measure.workloads import TORCHVISION, TRANSFORMERS, WORKLOADS, workload

if TYPE_CHECKING:
    from experiments.measure.workloads.base import Workload

MODEL_HELP = "torchvision:NAME, transformers:TYPE, path/to/file.py or package.module (docs/your-model.md)"


def kind(spec: str) -> str:
    """`builtin`, `torchvision`, `transformers` or `user` (a file or a module of the user's)."""
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
        from experiments.measure.workloads.base import Workload

        family = workload(spec)
        return Workload(spec, family.MODELS[spec], family.make_batch, family.loss)
    loaded = _module_for(what).load(spec, parse_model_config(model_config), image_size, seq_len)
    if expected_hash and loaded.source_hash != expected_hash:
        raise ValueError(f"--model={spec!r} changed since the sweep started (sha256 {loaded.source_hash}, "
                         f"recorded as {expected_hash}); run it again")
    return loaded


def _module_for(what: str):
    # The kinds import torch (and torchvision): imported once a spec is checked or loaded, not when the
    # command line imports this module to parse its options.
    from experiments.measure.workloads import torchvision_any, transformers_any, user_file

    return {"torchvision": torchvision_any, "transformers": transformers_any, "user": user_file}[what]


