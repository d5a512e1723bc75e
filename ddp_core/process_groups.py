"""Process groups: checking a backend can run here, and the paper's round-robin groups."""
from __future__ import annotations

import torch
import torch.distributed as dist

BACKENDS = ("nccl", "gloo", "mpi")


def check_backend(backend: str, device: str) -> None:
    """Raise ValueError unless `backend` is built into this torch and can reduce tensors on `device`."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; choose one of {', '.join(BACKENDS)}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r} is not supported; choose 'cpu' or 'cuda'")
    available = {"nccl": dist.is_nccl_available, "gloo": dist.is_gloo_available, "mpi": dist.is_mpi_available}
    if not available[backend]():
        raise ValueError(f"backend={backend!r} is not available in this torch build ({torch.__version__})")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' needs a CUDA GPU, and none is visible")
    if backend == "nccl" and device != "cuda":
        raise ValueError(f"backend='nccl' reduces only CUDA tensors, but device={device!r}; use gloo on the CPU")


def new_round_robin_groups(count: int, backend: str | None = None) -> list[dist.ProcessGroup]:
    """Create `count` process groups over all ranks, for DDP to dispatch buckets to in turn.

    Several groups give several concurrent communication channels (paper, "Round-Robin Process
    Group"). Every rank must call this at the same point, like any group creation.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be an integer >= 1, got {count!r}")
    return [dist.new_group(backend=backend) for _ in range(count)]
