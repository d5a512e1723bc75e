"""The training FLOPs of one iteration of any `--model`, counted by PyTorch's own `FlopCounterMode`.

One batch at the asked inputs goes forward and backward (the loss's gradient reaching every parameter),
on PyTorch's meta device where the model allows it: shapes only, so no memory and about a second even
for BERT-base at 16x128 tokens. A model that cannot run on the meta device (an operator without a meta
kernel, code that reads values) is counted on the CPU instead, which computes for real and takes longer.

What `FlopCounterMode` counts: matrix products, convolutions and attention, each at 2 FLOPs per
multiply-add, forward and backward (only the gradients autograd needs: not the input images'). Not
counted: element-wise work (activations, normalisation, the optimizer's step), a few percent of a
training step's FLOPs for the paper's models.
"""
from __future__ import annotations

import functools

from experiments.measure.workloads import spec as model_spec


def training_flops(model: str, model_config: str = "", batch_size: int = 32, image_size: int = 64,
                   seq_len: int = 32, model_hash: str = "") -> int:
    """FLOPs of one training iteration (forward and backward of one batch) of `model` at these inputs.

    `model_hash`, where given (a profile's record of a user's file), must still be the file's: a
    changed file has other FLOPs than the one profiled. ValueError naming the problem otherwise, or
    where the count fails on both devices or finds nothing to count.
    """
    if model_spec.kind(model) == "user":  # its file may have changed: loaded and counted afresh, never cached
        workload = model_spec.load.__wrapped__(model, model_config, image_size, seq_len)
        if model_hash and workload.source_hash != model_hash:
            raise ValueError(f"--model={model!r} changed since its profile was measured (sha256 "
                             f"{workload.source_hash}, profiled as {model_hash}); profile it again")
        return _counted(workload, model, batch_size, image_size, seq_len)
    return _library_flops(model, model_config, batch_size, image_size, seq_len)


@functools.lru_cache(maxsize=32)
def _library_flops(model: str, model_config: str, batch_size: int, image_size: int, seq_len: int) -> int:
    workload = model_spec.load(model, model_config, image_size, seq_len)
    return _counted(workload, model, batch_size, image_size, seq_len)


def _counted(workload, model: str, batch_size: int, image_size: int, seq_len: int) -> int:
    try:
        flops = _count(workload, batch_size, image_size, seq_len, "meta")
    except Exception:  # noqa: BLE001 - any failure on the meta device: count on the CPU, for real
        try:
            flops = _count(workload, batch_size, image_size, seq_len, "cpu")
        except Exception as error:  # noqa: BLE001 - the user's code may raise anything; say which model
            raise ValueError(f"--model={model!r}: its FLOPs could not be counted at batch {batch_size}, image "
                             f"{image_size}, sequence {seq_len}: {type(error).__name__}: {error}") from None
    if flops <= 0:
        raise ValueError(f"--model={model!r}: FlopCounterMode counted no FLOPs (it counts matrix products, "
                         "convolutions and attention; this model has none), so no GPU time can be estimated")
    return flops


def _count(workload, batch_size: int, image_size: int, seq_len: int, device: str) -> int:
    """Build on `device`, then count one forward (the loss) and its backward."""
    # torch is imported only to count: the command line imports this module (through gpus) to parse options.
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device(device):
        model = workload.build()
    batch = workload.make_batch(model, batch_size, image_size, seq_len, torch.Generator().manual_seed(0))
    batch = {key: value.to(device) for key, value in batch.items()}
    with FlopCounterMode(display=False) as counter:
        workload.loss(model, batch).backward()
    return int(counter.get_total_flops())
