"""Communication hooks: `hook(state, bucket) -> Future[Tensor]`, PyTorch's contract.

A hook receives a bucket (see `GradBucket`) and returns a future whose value is the bucket's
*averaged* flat gradient. `state` is whatever was registered with the hook; for the hooks here it is
the process group (None means the default group). Compression is a wrapper around any hook, so the
pieces compose: `compress_wrapper(torch.float16)(allreduce_hook)` is `fp16_compress_hook`.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

Hook = Callable[[object, object], torch.futures.Future]


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
