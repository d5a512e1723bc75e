"""ddp_core: a compact DistributedDataParallel on torch.distributed, read next to Li et al., VLDB 2020.

- `bucketing`: which gradients share a bucket;       - `grad_bucket`: one flat bucket (PyTorch's GradBucket API);
- `reducer`: ready hooks, in-order launch, overlap;  - `distributed`: the module wrapper;
- `hooks`: communication hooks (all-reduce, compression); - `process_groups`: backends, round-robin groups;
- `arguments`: PyTorch's signature checked and resolved;  - `timing`: what the reducer tells (logging data).
"""
from .bucketing import assign_buckets
from .distributed import DistributedDataParallel
from .grad_bucket import GradBucket
from .hooks import allreduce_hook, bf16_compress_hook, compress_wrapper, fp16_compress_hook
from .process_groups import check_backend, new_round_robin_groups

__all__ = [
    "DistributedDataParallel",
    "GradBucket",
    "allreduce_hook",
    "assign_buckets",
    "bf16_compress_hook",
    "check_backend",
    "compress_wrapper",
    "fp16_compress_hook",
    "new_round_robin_groups",
]
