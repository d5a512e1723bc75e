"""ddp_core: a compact DistributedDataParallel on torch.distributed, read next to Li et al., VLDB 2020.

- `distributed`: the module wrapper;                - `arguments`: PyTorch's signature checked and resolved;
- `reducer`: the coordinator of gradient synchronisation, made of one part per mechanism:
  `bucket_layout` (flat buffers), `ready_hooks` (a ready gradient into its bucket), `launch_order`
  (bucket i after bucket i-1), `write_back` (wait, .grad, used-parameter bitmap), `rebuild` (arrival
  order), `static_graph`;
- `bucketing`: which gradients share a bucket;       - `grad_bucket`: one flat bucket (PyTorch's GradBucket API);
- `hooks`: communication hooks (all-reduce, compression); - `process_groups`: backends, round-robin groups;
- `observer`: what the reducer tells during backward; - `timing`: its per-iteration figures (logging data);
- `auto_bucket`: bucket_cap_mb="auto";               - `schedule`: the bucket schedule's replay.
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
