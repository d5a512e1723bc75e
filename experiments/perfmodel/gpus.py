"""Compute times of the paper's models on GPUs that were not measured here: an estimate from FLOPs.

A profile measured on this machine says which gradient is ready when, relative to the rest of an
iteration; `scale_profile_record` keeps those proportions and stretches or shrinks the forward,
backward and optimizer times so that they sum to the estimated GPU time: the training FLOPs of one
iteration at the paper's inputs over the GPU's FP32 peak times an assumed achieved share. The tail
(writing reduced gradients back) is a copy, estimated from the GPU's memory bandwidth instead. A rough estimate, not a
measurement: a profile recorded on the GPU (`ddpbench profile --device cuda`) replaces it.
"""
from __future__ import annotations

import copy

# FP32 peak (non-tensor-core) of the SXM parts, from NVIDIA's datasheets.
PEAK_FP32_FLOPS = {"v100": 15.7e12, "a100": 19.5e12, "h100": 67e12}
ACHIEVED = 0.4  # assumed share of peak a training step reaches
# Memory bandwidth (HBM) of the same parts: the tail after backward (writing reduced gradients back)
# is a copy, bound by memory bandwidth, not by FLOPs.
MEMORY_BYTES_PER_S = {"v100": 900e9, "a100": 1555e9, "h100": 3.35e12}
# Training FLOPs per iteration and GPU, about 3x forward: ResNet50 4.1 GFLOPs per 224x224 image
# (forward), batch 32; BERT-base 6 x 110 M parameters per token, 16 sequences of 128 tokens.
TRAINING_FLOPS = {"resnet50": 3 * 4.1e9 * 32, "bert-base": 6 * 110e6 * 16 * 128}
PAPER_INPUTS = {"resnet50": {"batch_size": 32, "image_size": 224}, "bert-base": {"batch_size": 16, "seq_len": 128}}


def estimated_seconds(model: str, gpu: str) -> float:
    """Estimated compute seconds of one synchronised iteration of `model` at the paper's inputs on `gpu`."""
    if gpu not in PEAK_FP32_FLOPS:
        raise ValueError(f"gpu={gpu!r} is unknown; choose one of {', '.join(PEAK_FP32_FLOPS)}")
    if model not in TRAINING_FLOPS:
        raise ValueError(f"model={model!r} has no FLOPs estimate; choose one of {', '.join(TRAINING_FLOPS)}")
    return TRAINING_FLOPS[model] / (ACHIEVED * PEAK_FP32_FLOPS[gpu])


def scale_profile_record(record: dict, gpu: str) -> dict:
    """A copy of a profile record whose every time is scaled to `gpu`'s estimated compute time,
    saying so under `scaled_to` (the gpu, the factor, the basis, and the inputs the estimate assumes)."""
    from experiments.core.profile import Profile

    model = record["config"]["model"]
    seconds = estimated_seconds(model, gpu)
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
        "inputs": PAPER_INPUTS[model], "basis": f"{TRAINING_FLOPS[model]:.3g} training FLOPs per iteration at "
        f"{ACHIEVED:.0%} of {PEAK_FP32_FLOPS[gpu] / 1e12:g} TFLOP/s FP32 peak; times in proportion to the "
        f"profile measured on {record['config']['device']}; the tail (write-back) {tail * 1e3:.2f} ms: every "
        f"gradient read and written at {MEMORY_BYTES_PER_S[gpu] / 1e9:g} GB/s"}
    return scaled
