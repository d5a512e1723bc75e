"""The buckets' state: which parameter's gradient lives where, in which flat buffer (paper, section 3.2).

`bucketing.assign_buckets` decides which parameters share a bucket; this part turns that decision into
buffers (one `GradBucket` each), the index from parameter to its bucket and view, and, with
`gradient_as_bucket_view`, moves each `.grad` into its view. Re-bucketing (rebuild in arrival order,
or new caps) comes back here, and frees the old buffers as it goes.

A part of `Reducer` (see reducer.py): it owns `buckets`, `order` and `_location`, and reads the
reducer's `params`, `sparse`, caps and `gradient_as_bucket_view`.
"""
from __future__ import annotations

import torch

from .bucketing import TensorSpec, assign_buckets
from .grad_bucket import GradBucket


class BucketLayout:
    """The reducer's buckets and flat buffers, built from an order and the caps."""

    def build_buckets(self, order: list[int]) -> None:
        """(Re)assign parameters to buckets, visiting them in `order`, and allocate flat buffers."""
        specs = [TensorSpec(p.numel() * p.element_size(), (p.dtype, p.device), sparse)
                 for p, sparse in zip(self.params, self.sparse)]
        assignment = assign_buckets(specs, order, self.bucket_cap_mb, self.first_bucket_cap_mb,
                                    cap_list_mb=self.cap_list_mb)
        self.order = list(order)  # the gradient order the buckets were built in (re-bucketing keeps it)
        # The old buckets are let go before the new ones are made: without gradient views their memory
        # returns at once. With views, each .grad lives in an old bucket until it moves into a new one;
        # the old buckets are remembered as address ranges only, so that each goes once nothing views it.
        old = [(set(b.param_indices), b.flat.data_ptr(), b.flat.numel() * b.flat.element_size())
               for b in getattr(self, "buckets", []) if not b.sparse] if self.gradient_as_bucket_view else []
        self.buckets, self._location = [], {}  # _location: parameter index -> (bucket, its gradient's view)
        moved: set[int] = set()
        for b, indices in enumerate(assignment):
            bucket = GradBucket(b, [self.params[i] for i in indices], indices, is_last=b == len(assignment) - 1,
                                sparse=self.sparse[indices[0]])
            self.buckets.append(bucket)
            views = [None] if bucket.sparse else bucket.views  # a sparse gradient has no view
            for i, view in zip(bucket.param_indices, views):
                self._location[i] = (bucket, view)
            if self.gradient_as_bucket_view and not bucket.sparse:  # (a sparse gradient is never a view)
                with torch.no_grad():
                    for p, view in zip(bucket.parameters(), bucket.views):
                        if p.grad is not None:
                            view.copy_(p.grad)
                            p.grad = view
                moved.update(indices)
                old = self._release_cut_buckets(old, moved)

    def _release_cut_buckets(self, old: list[tuple[set[int], int, int]], moved: set[int]) -> list:
        """Old buckets that new ones cut through: their gradients not yet moved are copied out, so that
        the old bucket's memory returns now. Its moved part is freed that way, and re-bucketing never holds
        more than the gradients plus the new bucket being filled. Returns the old buckets still whole."""
        whole = []
        for indices, start, size in old:
            if not indices & moved:
                whole.append((indices, start, size))
                continue
            for i in indices - moved:
                grad = self.params[i].grad
                if grad is not None and start <= grad.data_ptr() < start + size:
                    self.params[i].grad = grad.clone()  # (the new bucket will take it back as a view)
        return whole
