"""ddp_core is a drop-in for torch.nn.parallel.DistributedDataParallel beyond the plain training step (issue 16).

Every check runs the same model and inputs once under ddp_core and once under PyTorch's DDP, on 2 ranks
(Gloo, real processes): either both give the same gradients, or both refuse with the same kind of error.
All checks share one launch; each records its outcome, so that one failure does not hide the others.
"""

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import ddp_core


# --- models ---


# --- what runs on each rank ---


def annotated_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    return default_hooks.allreduce_hook(state, bucket)


def test_ddp_core_accepts_its_own_hooks_and_annotated_ones():
    for hook in (ddp_core.allreduce_hook, ddp_core.fp16_compress_hook, default_hooks.allreduce_hook, annotated_hook):
        ddp_core.hooks.check_hook(hook)
