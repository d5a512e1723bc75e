"""Communication hooks: `hook(state, bucket) -> Future[Tensor]`, PyTorch's contract.

A hook receives a bucket (see `GradBucket`) and returns a future whose value is the bucket's
*averaged* flat gradient. `state` is whatever was registered with the hook; for the hooks here it is
the process group (None means the default group). Compression is a wrapper around any hook, so the
pieces compose: `compress_wrapper(torch.float16)(allreduce_hook)` is `fp16_compress_hook`.
"""
from __future__ import annotations

import inspect
import typing
from typing import Callable

import torch
import torch.distributed as dist

Hook = Callable[[object, object], torch.futures.Future]


def check_hook(hook: object) -> None:
    """Refuse a hook as PyTorch's DDP does: TypeError if not callable, ValueError if its annotations
    say that the bucket is not a GradBucket or that it returns no Future."""
    if not callable(hook):
        # The messages start as PyTorch's, so that code matching PyTorch's errors matches ddp_core's.
        raise TypeError(f"Communication hook must be callable. (ddp_core: got {hook!r})")
    try:
        signature = inspect.signature(hook)
    except (TypeError, ValueError):
        return  # a builtin without a signature: nothing to check
    positional = [p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    bucket = signature.parameters.get("bucket") or (positional[1] if len(positional) > 1 else None)
    name = getattr(hook, "__qualname__", repr(hook))
    if bucket is not None and not _annotation_names(bucket.annotation, "GradBucket"):
        raise ValueError(f"Communication hook: bucket annotation should be dist.GradBucket. (ddp_core: hook "
                         f"{name} annotates it {bucket.annotation!r}; PyTorch's or ddp_core's GradBucket)")
    if not _annotation_names(signature.return_annotation, "Future"):
        raise ValueError("Communication hook: return annotation should be torch.futures.Future[torch.Tensor]. "
                         f"(ddp_core: hook {name} annotates {signature.return_annotation!r})")


def _annotation_names(annotation: object, class_name: str) -> bool:
    """True if `annotation` is absent or names `class_name` (as a class, a generic such as Future[Tensor],
    or a string, which `from __future__ import annotations` leaves)."""
    if annotation is inspect.Parameter.empty:
        return True
    if isinstance(annotation, str):
        return class_name in annotation
    origin = typing.get_origin(annotation) or annotation
    return getattr(origin, "__name__", None) == class_name


def allreduce_hook(process_group: dist.ProcessGroup | None, bucket) -> torch.futures.Future:
    """Average the bucket over the group: divide first (keeps the sum in range), then all-reduce."""
    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size(group))
    work = dist.all_reduce(tensor, group=group, async_op=True)  # asynchronous: backward goes on
    return work.get_future().then(lambda fut: fut.value()[0])


def compress_wrapper(dtype: torch.dtype) -> Callable[[Hook], Hook]:
    """Make a hook send the bucket as `dtype` and write the result back in full precision."""
    if not dtype.is_floating_point:
        raise ValueError(f"compress_wrapper needs a floating-point dtype, got {dtype}")

    def wrap(hook: Hook) -> Hook:
        def compressed_hook(state, bucket) -> torch.futures.Future:
            full = bucket.buffer()
            bucket.set_buffer(full.to(dtype))
            # Decompress into the original buffer in place: no second full-size tensor.
            return hook(state, bucket).then(lambda fut: full.copy_(fut.value()))

        compressed_hook.__name__ = f"{dtype_name(dtype)}_compress_{hook.__name__}"
        return compressed_hook

    return wrap


def dtype_name(dtype: torch.dtype) -> str:
    """Short name of a dtype, e.g. 'float16' for torch.float16."""
    return str(dtype).removeprefix("torch.")


fp16_compress_hook = compress_wrapper(torch.float16)(allreduce_hook)
bf16_compress_hook = compress_wrapper(torch.bfloat16)(allreduce_hook)

# Names the runner and the CLI accept for --comm-hook.
HOOKS: dict[str, Hook] = {
    "allreduce": allreduce_hook,
    "fp16": fp16_compress_hook,
    "bf16": bf16_compress_hook,
}
