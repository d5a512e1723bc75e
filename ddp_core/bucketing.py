"""Assigning parameters to gradient buckets (paper, section "Gradient Bucketing").

Many small all-reduces are much slower than a few large ones, so gradients are packed into flat
buckets. Which parameters share a bucket is decided here, as a pure function of sizes and order, so
that it can be read, tested and reused (the performance model simulates the same assignment).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

MB = 1024 * 1024


@dataclass(frozen=True)
class TensorSpec:
    """What bucketing needs to know about one gradient: its size in bytes and what it may share with."""

    nbytes: int
    # Tensors with different keys (dtype, device) never share a flat bucket.
    key: Hashable = None
    # A sparse gradient cannot be packed into a flat buffer: it is reduced as it is, in a bucket of its own.
    sparse: bool = False


def assign_buckets(
    specs: Sequence[TensorSpec],
    order: Sequence[int],
    bucket_cap_mb: float,
    first_bucket_cap_mb: float | None = None,
    cap_list_mb: Sequence[float] | None = None,
) -> list[list[int]]:
    """Group tensor indices into buckets, visiting them in `order`; returns buckets in launch order.

    A bucket takes tensors until its total reaches the cap, the tensor that reaches it included (as
    PyTorch's `_compute_bucket_assignment_by_size` does: a bucket may end up larger than its cap, so that
    the same model gets the same buckets, and a hook that depends on them, as PowerSGD does, the same
    result); a cap of 0 means one tensor per bucket; a sparse tensor always gets one of its own. The first bucket of each key uses
    `first_bucket_cap_mb` if smaller (PyTorch's small first bucket starts communication early).
    Buckets are returned ordered by the position of their first tensor in `order`, which is the
    order in which backward is expected to fill them. `cap_list_mb` (PyTorch's bucket_cap_mb_list)
    gives each bucket of a key its own cap, the last repeating; it replaces both other caps.
    """
    if bucket_cap_mb < 0:
        raise ValueError(f"bucket_cap_mb must be >= 0, got {bucket_cap_mb!r}")
    if first_bucket_cap_mb is not None and first_bucket_cap_mb < 0:
        raise ValueError(f"first_bucket_cap_mb must be >= 0 or None, got {first_bucket_cap_mb!r}")
    if sorted(order) != list(range(len(specs))):
        raise ValueError(f"order must be a permutation of range({len(specs)}), got {list(order)!r}")

    cap = int(bucket_cap_mb * MB)
    # The first bucket is never larger than the others, so a cap of 0 means one tensor per bucket.
    first_cap = cap if first_bucket_cap_mb is None else min(cap, int(first_bucket_cap_mb * MB))
    caps = [int(c * MB) for c in cap_list_mb] if cap_list_mb else [first_cap, cap]
    open_buckets: dict[Hashable, tuple[list[int], int]] = {}  # key -> (indices, bytes)
    closed_per_key: dict[Hashable, int] = {}  # buckets closed so far, per key: picks the next cap
    closed: list[list[int]] = []

    for index in order:
        spec = specs[index]
        if spec.sparse:
            closed.append([index])
            continue
        indices, size = open_buckets.get(spec.key, ([], 0))
        limit = caps[min(closed_per_key.get(spec.key, 0), len(caps) - 1)]
        indices.append(index)
        size += spec.nbytes
        if size >= limit:  # full: close it now
            closed.append(indices)
            closed_per_key[spec.key] = closed_per_key.get(spec.key, 0) + 1
            indices, size = [], 0
        open_buckets[spec.key] = (indices, size)

    closed.extend(indices for indices, _ in open_buckets.values() if indices)
    position = {index: pos for pos, index in enumerate(order)}
    closed.sort(key=lambda bucket: position[bucket[0]])
    return closed
