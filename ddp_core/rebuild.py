"""Rebuilding the buckets once, in the order gradients really arrived (later PyTorch; paper, section 3.2).

Before the first backward the buckets follow reverse registration order, a guess; the ready hooks
record the order gradients actually arrive in (`_arrival_order`), and before the next forward the
buckets are rebuilt in rank 0's order, the same on every rank. `rebucket` re-buckets under new caps
(bucket_cap_mb="auto" does it for each layout it tries), keeping the order.

A part of `Reducer` (see reducer.py): it owns `_rebuild_enabled`, `_rebuild_pending`, `_arrival_order`
and `rebuilt_layout`; the ready hooks append to `_arrival_order`, `bucket_layout` builds the buckets.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


class BucketRebuild:
    """Rebuild the reducer's buckets in arrival order (once) or under new caps."""

    def _init_rebuild(self, rebuild_buckets: bool) -> None:
        """Arm the rebuild after the first synchronised iteration, where PyTorch would."""
        # PyTorch does not rebuild with unused-parameter detection (the arrival order may vary) unless
        # the graph is declared static.
        self._rebuild_enabled = rebuild_buckets
        self._rebuild_pending = rebuild_buckets and (self.static_graph or not self.find_unused_parameters)
        self._arrival_order: list[int] = []
        self.rebuilt_layout: dict[str, str] = {}  # the logging data's description of the rebuilt buckets

    def maybe_rebuild_buckets(self) -> None:
        """After the first synchronised iteration, re-bucket in the order gradients really arrived.

        Ranks may observe slightly different orders, so rank 0's order is broadcast and used by all.
        """
        if not self._rebuild_pending or len(self._arrival_order) != len(self.params):
            return
        self._rebuild_pending = False
        order = torch.tensor(self._arrival_order, dtype=torch.int64, device=self.params[0].device)
        group = self.groups[0]
        dist.broadcast(order, src=dist.get_global_rank(group, 0), group=group)
        self.build_buckets(order.tolist())
        self._describe_rebuilt()

    def rebucket(self, bucket_cap_mb: float, first_bucket_cap_mb: float) -> None:
        """Re-bucket under new caps, in the order of the current buckets (bucket_cap_mb="auto" does this
        for each layout it tries and once more for the one it keeps, between iterations, with the same caps
        on every rank)."""
        self.bucket_cap_mb, self.first_bucket_cap_mb = bucket_cap_mb, first_bucket_cap_mb
        self.build_buckets(self.order)
        self._describe_rebuilt()

    @property
    def has_rebuilt_buckets(self) -> bool:
        """Whether the buckets were rebuilt in the order gradients arrived (after the first backward)."""
        return not self._rebuild_pending and bool(self._arrival_order)

    def _describe_rebuilt(self) -> None:
        self.rebuilt_layout = {  # as PyTorch's logging data describes rebuilt buckets
            "rebuilt_bucket_sizes": ", ".join(str(0 if b.sparse else b.flat.numel() * b.flat.element_size())
                                              for b in self.buckets),
            "rebuilt_per_bucket_param_indices": ", ".join(" ".join(map(str, b.param_indices)) for b in self.buckets),
        }
