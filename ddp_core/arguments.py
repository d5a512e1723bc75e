"""The arguments of DistributedDataParallel: PyTorch's signature checked and resolved, before anything runs.

Each function takes one of PyTorch's parameters (or a pair that goes together) and returns what the
wrapper uses, or raises naming the parameter, the value and what is allowed. Parameters that mean
nothing for ddp_core's one-device-per-process design are refused with the reason, never ignored.
"""
from __future__ import annotations

import math
import warnings

import torch
import torch.distributed as dist
from torch import nn


class DDPError(RuntimeError, ValueError):
    """Bad use that PyTorch's DDP reports as RuntimeError and ddp_core first reported as ValueError:
    catching either works."""


_UNSUPPORTED = {
    "delay_all_reduce_named_params": "delaying some parameters' all-reduce to another parameter's hook is not "
                                     "implemented; wrap the module without them instead",
    "param_to_hook_all_reduce": "it goes with delay_all_reduce_named_params, which is not implemented",
    "mixed_precision": "DDP-native mixed precision (_MixedPrecision) is not implemented; use torch.autocast "
                       "or a compression hook (ddp_core.fp16_compress_hook)",
    "batched_grad_copy": "ddp_core copies each gradient into its bucket as it arrives; batching the copies "
                         "per bucket is not implemented",
}


def refuse_unsupported(**given) -> None:
    """Raise DDPError naming the first parameter that ddp_core does not implement and was given."""
    for name, value in given.items():
        if value is not None and value is not False:
            raise DDPError(f"ddp_core: {name}={value!r} is not supported: {_UNSUPPORTED[name]}")


def check_cap_list(caps) -> list[float] | None:
    """PyTorch's bucket_cap_mb_list: one cap per bucket, the last repeating; empty or None means none."""
    if not caps:
        return None
    for cap in caps:
        check_cap("bucket_cap_mb_list", cap)
    return list(caps)


def group_from_mesh(process_group, device_mesh):
    """The process group of a 1-D device mesh, refused as PyTorch refuses it with a group or more dims."""
    if device_mesh is None:
        return process_group
    if process_group is not None:
        raise DDPError("ddp_core: Cannot specify both process_group and device_mesh arguments.")
    if device_mesh.ndim != 1:
        raise DDPError(f"ddp_core: device_mesh: only a 1-D device mesh is supported, but got {device_mesh}")
    return device_mesh.get_group(mesh_dim=0)


def check_output_device(output_device, device_ids):
    """PyTorch's rule: output_device only with device_ids (a single-device GPU module), default device_ids[0]."""
    if device_ids is None:
        if output_device:  # PyTorch tests truthiness: 0 passes (and means nothing on the CPU)
            raise DDPError(f"ddp_core: output_device={output_device!r} works only with device_ids "
                           "(a single-device GPU module); it must be None for a CPU module")
        return None
    if output_device is None:
        return device_ids[0].index
    return torch.device(output_device).index if not isinstance(output_device, int) else output_device


def buffer_sync(broadcast_buffers, forward_sync_buffers) -> tuple[bool, bool]:
    """(sync buffers before each forward, sync them at construction), resolved as PyTorch 2.14 does."""
    if broadcast_buffers is not None:
        warnings.warn(
            "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead"
            + (" (its value is ignored when `forward_sync_buffers` is given)." if forward_sync_buffers is not None
               else ". Unlike `broadcast_buffers=False`, `forward_sync_buffers=False` still syncs buffers at init."),
            FutureWarning, stacklevel=3)
    if forward_sync_buffers is not None:
        return bool(forward_sync_buffers), True
    effective = True if broadcast_buffers is None else bool(broadcast_buffers)
    return effective, effective


def ignored_names(module: nn.Module) -> set[str]:
    """Names the module asks DDP to leave alone (`_ddp_params_and_buffers_to_ignore`)."""
    return set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))


def synchronised_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The (name, parameter) pairs DDP reduces: trainable and not ignored."""
    ignored = ignored_names(module)
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad and name not in ignored]


def sparse_gradient_parameters(module: nn.Module) -> set[int]:
    """Ids of the parameters whose gradient will be sparse, known from their module as in PyTorch's DDP."""
    return {id(m.weight) for m in module.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse}


def check_cap(name: str, value: float) -> None:
    """A bucket cap in MB: a number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{name} must be a number >= 0 (0 means one parameter per bucket), got {value!r}")


def check_cap_or_auto(name: str, value) -> bool:
    """A bucket cap in MB (a number >= 0) or "auto" (ddp_core chooses it); True for "auto"."""
    if value == "auto":
        return True
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
        raise ValueError(f"{name}={value!r} is not allowed: it must be a number of MB >= 0 (0 means one "
                         "parameter per bucket) or \"auto\" (ddp_core chooses the cap while it trains)")
    return False


def as_group_list(process_group) -> list[dist.ProcessGroup]:
    """The groups to reduce over: the default group, the one given, or round-robin groups of equal size."""
    if not dist.is_initialized():
        raise RuntimeError("ddp_core: call torch.distributed.init_process_group before wrapping a module")
    if process_group is None:
        return [dist.group.WORLD]
    if isinstance(process_group, (list, tuple)):
        groups = list(process_group)
        if not groups:
            raise ValueError("process_group: an empty list of groups was given")
        sizes = {dist.get_world_size(g) for g in groups}
        if len(sizes) != 1:
            raise ValueError(f"process_group: round-robin groups must span the same ranks, got sizes {sorted(sizes)}")
        return groups
    return [process_group]


def check_device_ids(device_ids, param: torch.Tensor) -> list[torch.device] | None:
    """device_ids: None on the CPU, else exactly the one device the module is on."""
    if device_ids is None:
        return None
    if param.device.type == "cpu":
        raise ValueError(f"device_ids must be None for a module on the CPU, got {device_ids!r}")
    if len(device_ids) != 1:
        raise ValueError(f"device_ids must hold exactly one device (single-device modules only), got {device_ids!r}")
    device = torch.device(param.device.type, device_ids[0]) if isinstance(device_ids[0], int) else torch.device(device_ids[0])
    if device != param.device:
        raise ValueError(f"device_ids={device_ids!r} does not match the module's device {param.device}")
    return [device]


def check_backend_fits(group: dist.ProcessGroup, device: torch.device) -> None:
    """NCCL reduces only CUDA tensors: refuse a module elsewhere before the first collective."""
    backend = dist.get_backend(group)
    if backend == "nccl" and device.type != "cuda":
        raise ValueError(f"ddp_core: the NCCL backend reduces only CUDA tensors, but the module is on {device}")


def check_same_parameters(named: list[tuple[str, torch.Tensor]], group: dist.ProcessGroup) -> None:
    """Fail on every rank, naming the first difference, if the ranks do not hold the same model."""
    signature = [(name, tuple(p.shape), str(p.dtype)) for name, p in named]
    gathered: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, signature, group=group)
    reference = gathered[0]
    for rank, other in enumerate(gathered[1:], start=1):
        if other == reference:
            continue
        if len(other) != len(reference):
            detail = f"{len(reference)} trainable parameters on rank 0, {len(other)} on rank {rank}"
        else:
            first = next(i for i, (a, b) in enumerate(zip(reference, other)) if a != b)
            detail = f"parameter {first}: {reference[first]} on rank 0, {other[first]} on rank {rank}"
        raise DDPError(f"ddp_core: the ranks hold different models ({detail})")
