"""Compute times of a model on GPUs that were not measured here: an estimate from FLOPs.

A profile measured on this machine says which gradient is ready when, relative to the rest of an
iteration; `scale_profile_record` keeps those proportions and stretches or shrinks the forward,
backward and optimizer times so that they sum to the estimated GPU time: the training FLOPs of one
iteration at the asked inputs (counted by PyTorch's FlopCounterMode, see flops.py) over the GPU's FP32
peak times an assumed achieved share. The tail (writing reduced gradients back) is a copy, estimated
from the GPU's memory bandwidth instead. A rough estimate, not a measurement: a profile recorded on the
GPU (`ddpbench profile --device cuda`) replaces it.
"""
from __future__ import annotations

import copy

from experiments.perfmodel.flops import training_flops

# FP32 peak (non-tensor-core) of the SXM parts, from NVIDIA's datasheets.
PEAK_FP32_FLOPS = {"v100": 15.7e12, "a100": 19.5e12, "h100": 67e12}
ACHIEVED = 0.4  # assumed share of peak a training step reaches
# Memory bandwidth (HBM) of the same parts: the tail after backward (writing reduced gradients back)
# is a copy, bound by memory bandwidth, not by FLOPs.
MEMORY_BYTES_PER_S = {"v100": 900e9, "a100": 1555e9, "h100": 3.35e12}
# The paper's inputs per GPU: what the estimates of its two models are for, unless asked otherwise.
PAPER_INPUTS = {"resnet50": {"batch_size": 32, "image_size": 224}, "bert-base": {"batch_size": 16, "seq_len": 128}}
INPUTS = ("batch_size", "image_size", "seq_len")


def estimate_inputs(config: dict, **asked: int | None) -> dict:
    """The inputs a GPU estimate of a profile of `config` is for: the asked ones (batch_size, image_size,
    seq_len; None: not asked) over the paper's for its two models, else over the profile's own."""
    base = PAPER_INPUTS.get(config["model"]) or {key: config[key] for key in INPUTS}
    return {**base, **{key: value for key, value in asked.items() if value is not None}}


def flops_of(config: dict, inputs: dict) -> int:
    """Training FLOPs of one iteration of `config`'s model (with its model_config and file) at `inputs`."""
    full = {key: inputs.get(key, config.get(key)) for key in INPUTS}
    return training_flops(config["model"], config.get("model_config", ""), full["batch_size"], full["image_size"],
                          full["seq_len"], config.get("model_hash", ""))


def estimated_seconds(model: str, gpu: str, inputs: dict | None = None, config: dict | None = None) -> float:
    """Estimated compute seconds of one synchronised iteration of `model` on `gpu` at `inputs` (default:
    the paper's, for resnet50 and bert-base); `config`: the profile's config where there is one (its
    model_config, its file's hash, and the inputs not asked)."""
    if gpu not in PEAK_FP32_FLOPS:
        raise ValueError(f"gpu={gpu!r} is unknown; choose one of {', '.join(PEAK_FP32_FLOPS)}")
    config = {"model": model, "model_config": "", "model_hash": "", "batch_size": 32, "image_size": 64,
              "seq_len": 32, **(config or {})}
    inputs = estimate_inputs(config) if inputs is None else inputs
    return flops_of(config, inputs) / (ACHIEVED * PEAK_FP32_FLOPS[gpu])


def scale_profile_record(record: dict, gpu: str, inputs: dict | None = None) -> dict:
    """A copy of a profile record whose every time is scaled to `gpu`'s estimated compute time at
    `inputs` (default: estimate_inputs), saying so under `scaled_to` (the gpu, the factor, the FLOPs and
    the basis, and the inputs the estimate is for)."""
    from experiments.core.profile import Profile

    config = record["config"]
    inputs = estimate_inputs(config) if inputs is None else inputs
    flops = flops_of(config, inputs)
    seconds = estimated_seconds(config["model"], gpu, inputs, config)
    measured = Profile.from_record(record)
    factor = seconds / (measured.compute - measured.tail)  # forward, backward and step: FLOPs
    tail = 2 * sum(record["bytes"]) / MEMORY_BYTES_PER_S[gpu]  # the write-back reads and writes every gradient

    def scale(row: dict) -> dict:
        return {key: tail if key == "tail" else [t * factor for t in value] if isinstance(value, list)
                else value * factor for key, value in row.items()}

    scaled = copy.deepcopy(record)
    scaled["synced"], scaled["skipped"] = [scale(r) for r in record["synced"]], [scale(r) for r in record["skipped"]]
    scaled["other_copies"] = [{k: [scale(r) for r in rows] for k, rows in other.items()}
                              for other in record.get("other_copies", [])]
    scaled["summary"] = {k: ([t * factor for t in v] if isinstance(v, list) else v * factor)
                         for k, v in record["summary"].items()}
    scaled["summary"].update(tail=tail, p50=seconds + tail)
    scaled["scaled_to"] = {
        "gpu": gpu, "device": f"{gpu.upper()} (estimated from FLOPs)", "factor": factor, "compute_s": seconds + tail,
        "inputs": inputs, "training_flops": flops,
        "basis": f"{flops:.3g} training FLOPs per iteration (torch.utils.flop_counter, forward and backward) at "
        f"{ACHIEVED:.0%} of {PEAK_FP32_FLOPS[gpu] / 1e12:g} TFLOP/s FP32 peak; times in proportion to the "
        f"profile measured on {record['config']['device']}; the tail (write-back) {tail * 1e3:.3g} ms: every "
        f"gradient read and written at {MEMORY_BYTES_PER_S[gpu] / 1e9:g} GB/s"}
    return scaled
