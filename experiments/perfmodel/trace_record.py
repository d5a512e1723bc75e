"""A trace of the user's own loop as a profile record, so that the scale model can replay its compute.

    ddpbench scale-profile --trace my_loop.json --model torchvision:resnet18 --model-config num_classes=10 --out P.jsonl
    ddpbench run --model torchvision:resnet18 --model-config num_classes=10 --compute emulated \
        --compute-profile P.jsonl --world-size 16 --ranks-per-host 8 --link 100gbit --time-dilation 50

The scale model's stand-in (`experiments/emulate/compute.py`) hands every parameter of the model its
gradient at a profiled moment, so it needs the times per parameter, in the model's order. A trace
gives its gradients in the order they became ready, with shapes but no names. This module matches
them to the parameters of `--model` built on the meta device: each gradient, in arrival order, goes to
the not yet matched trainable parameter of the same shape and dtype that comes last in the model's
order (backward produces gradients roughly from the last layer to the first). Parameters of equal shape
and dtype are interchangeable for DDP, which buckets by size and order of arrival, so where the guess
swaps two of them nothing the scale model measures changes. A trace of another model or configuration
is refused, naming the first gradient without a parameter.

The record is a `kind: profile` record (records.md) with `source: trace`: per traced iteration its
forward, backward, tail and optimizer, and each parameter's ready time. The trace has no iteration
under no_sync, so the skipped iterations (reduce every n, E5) repeat the synchronised forward and
backward. `other` (data loading, the user's own work) is not part of a profile; the record keeps it
under `trace` beside the path and the steps it came from.
"""
from __future__ import annotations

import dataclasses
import hashlib
import statistics
from pathlib import Path

from experiments.core.config import ConfigError, RunConfig
from experiments.perfmodel.trace import TraceProfile


def match_parameters(gradients: list[tuple[tuple[int, ...], str]],
                     parameters: list[tuple[str, tuple[int, ...], str]]) -> list[int]:
    """For each traced gradient (shape, dtype), in arrival order, the index of its parameter among
    `parameters` (name, shape, dtype, in the model's order); ConfigError where they do not fit."""
    if len(gradients) != len(parameters):
        raise ConfigError(f"the trace has {len(gradients)} gradients, the model {len(parameters)} trainable parameters: "
                          "trace the same model and configuration as --model and --model-config")
    free: dict[tuple, list[int]] = {}
    for index, (_, shape, dtype) in enumerate(parameters):
        free.setdefault((tuple(shape), dtype), []).append(index)
    matched = []
    for arrival, (shape, dtype) in enumerate(gradients):
        candidates = free.get((tuple(shape), dtype))
        if not candidates:
            raise ConfigError(f"traced gradient #{arrival} {list(shape)} {dtype} matches no parameter of the model left "
                              "unmatched: trace the same model and configuration as --model and --model-config")
        matched.append(candidates.pop())  # the last in the model's order: backward runs from the end
    return matched


def model_parameters(config: RunConfig) -> tuple[list[tuple[str, tuple[int, ...], str]], int]:
    """The trainable parameters (name, shape, dtype) of `config`'s model, built on the meta device, and
    its buffers' bytes."""
    from experiments.emulate.compute import model_layout
    from experiments.measure.workloads.spec import load

    workload = load(config.model, config.model_config, config.image_size, config.seq_len)
    layout = model_layout(workload.build)
    parameters = [(name, tuple(p.shape), str(p.dtype)) for name, p in layout.named_parameters() if p.requires_grad]
    buffers = sum(b.numel() * b.element_size() for b in layout.buffers())
    return parameters, buffers


def profile_record(trace: TraceProfile, path: Path, config: RunConfig) -> dict:
    """The profile record of `config`'s model whose times are the trace's (see the module docstring)."""
    parameters, buffer_bytes = model_parameters(config)
    order = match_parameters([(g.shape, g.dtype) for g in trace.gradients], parameters)
    by_parameter = {parameter: arrival for arrival, parameter in enumerate(order)}

    def in_model_order(ready: list[float]) -> list[float]:
        return [ready[by_parameter[index]] for index in range(len(parameters))]

    synced = [{"forward": it["forward"], "backward": it["backward"], "tail": it["tail"], "optimizer": it["optimizer"],
               "ready": in_model_order(it["ready"])} for it in trace.iterations]
    skipped = [{"forward": it["forward"], "backward": it["backward"]} for it in trace.iterations]
    phases = ("forward", "backward", "tail", "optimizer")
    summary = {phase: statistics.median(row[phase] for row in synced) for phase in phases}
    summary["p50"] = statistics.median(sum(row[phase] for phase in phases) for row in synced)
    return {
        "kind": "profile", "status": "ok", "source": "trace", "config": dataclasses.asdict(config), "summary": summary,
        "synced": synced, "skipped": skipped, "names": [name for name, _, _ in parameters],
        "bytes": [trace.gradients[by_parameter[i]].nbytes for i in range(len(parameters))],
        "dtypes": [dtype for _, _, dtype in parameters],
        # batch norms' running statistics as traced where the trace shows them, else the model's buffers
        "buffer_bytes": trace.profile.buffer_bytes or buffer_bytes,
        "trace": {"file": str(path), "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16],
                  "steps": trace.steps, "other_s": trace.other, "accumulate_s": trace.accumulate,
                  "warnings": trace.warnings},
    }


def trace_config(model: str, model_config: str, batch_size: int | None, image_size: int | None,
                 seq_len: int | None, copies: int, device: str) -> RunConfig:
    """The config a traced profile is stored under: the model as `run --model` names it, the traced inputs
    where given (they only label the record, and size a GPU estimate), and the copies that ran when traced."""
    given = {"batch_size": batch_size, "image_size": image_size, "seq_len": seq_len}
    return dataclasses.replace(RunConfig(), model=model, model_config=model_config, world_size=copies, device=device,
                               backend="nccl" if device == "cuda" else "gloo", impl="ddp_core_no_overlap",
                               **{k: v for k, v in given.items() if v is not None})

