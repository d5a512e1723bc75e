"""Workloads: one small file per model family, each offering `MODELS`, `make_batch` and `loss`.

`MODELS` maps a model name to a builder (random initialisation from a config: nothing is downloaded);
`make_batch(model, batch_size, image_size, seq_len, generator)` makes a synthetic batch on the CPU;
`loss(model, batch)` returns the scalar training loss.
`spec.py` resolves every `--model` (these names, torchvision:, transformers:, the user's file) to one Workload.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

# Every model is built from a configuration with random weights: nothing ever needs the Hugging Face hub,
# and a benchmark must not wait on (or be slowed by) the network. Set before transformers is imported.
os.environ["HF_HUB_OFFLINE"] = "1"

TORCHVISION, TRANSFORMERS = "torchvision:", "transformers:"  # the prefixes of --model for library models
# Built-in model name -> the family module that builds it (its MODELS; tests/unit/test_cli_start_up.py checks the
# two agree). Names, not modules: the command line lists and checks them without importing torch.
WORKLOADS: dict[str, str] = {"resnet50": "resnet", "resnet-tiny": "resnet", "bert-base": "bert", "bert-tiny": "bert"}


def workload(name: str) -> ModuleType:
    """The workload module that builds `name`; ValueError listing the known names otherwise."""
    if name not in WORKLOADS:
        raise ValueError(f"model={name!r} is unknown; choose one of {', '.join(sorted(WORKLOADS))}")
    # Only the family asked for: a ResNet's ranks skip transformers (3.4 s to import here, in every rank;
    # tests/unit/test_cli_start_up.py). A BERT's import torchvision all the same: transformers does.
    return importlib.import_module(f"experiments.measure.workloads.{WORKLOADS[name]}")
