"""The end of backward: wait for each bucket in turn and write its averaged gradients back to `.grad`
(paper, section 3.2.3), only for parameters some rank used (the used-parameter bitmap, section 3.2.4).

A part of `Reducer` (see reducer.py): the coordinator calls it once launching is over; it reads the
buckets, `comm_hook` and `gradient_as_bucket_view`, and writes `.grad`.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from .grad_bucket import GradBucket


class WriteBack:
    """Wait for the buckets' reductions and copy the averaged gradients out of them."""

    def _used_on_some_rank(self, locally_used: list[bool]) -> list[int]:
        """All-reduce the used-parameter bitmap: per parameter, how many ranks used it (blocking)."""
        flags = torch.tensor(locally_used, dtype=torch.int32, device=self.params[0].device)
        dist.all_reduce(flags, group=self.groups[0])
        return flags.tolist()

    def _wait_and_write_back(self, used: list[int] | None) -> None:
        """Bucket by bucket, in launch order: wait for its reduction, write its gradients to `.grad`
        (of the parameters `used` marks, or all when it is None)."""
        for index, bucket in enumerate(self.buckets):
            try:
                result = bucket.future.wait()  # this is a sync point: exposed communication
            except Exception:
                # A failed hook or collective: before the error surfaces, let the later buckets'
                # collectives finish, so that none still writes into a bucket the next backward fills.
                # (.grad then holds averaged gradients for the buckets before this one only.)
                for later in self.buckets[index + 1:]:
                    with contextlib.suppress(Exception):
                        later.future.wait()
                raise
            if bucket.sparse:  # the reduced sparse gradient is a new tensor
                self._write_back_sparse(bucket, result[0] if isinstance(result, list) else result, used)
                continue
            # A hook's future holds the reduced bucket, maybe in a tensor of its own; the plain
            # all-reduce worked in place.
            if self.comm_hook is not None and result.data_ptr() != bucket.flat.data_ptr():
                bucket.flat.copy_(result)
            # Bucket by bucket, as PyTorch does: copying one bucket's gradients out overlaps with the
            # reduction of the buckets after it (BERT's last bucket alone holds 94 MB of embeddings).
            # With find_unused_parameters the blocking flags all-reduce before it has mostly waited already.
            self._write_back(bucket, used)

    def _write_back_sparse(self, bucket: GradBucket, reduced: torch.Tensor, globally_used: list[int] | None) -> None:
        index = bucket.param_indices[0]
        if globally_used is None or globally_used[index]:
            self.params[index].grad = reduced

    def _write_back(self, bucket: GradBucket, globally_used: list[int] | None) -> None:
        grads, views = [], []  # existing .grad tensors to overwrite, and their averaged values
        with torch.no_grad():
            for i, view in zip(bucket.param_indices, bucket.views):
                param = self.params[i]
                if globally_used is not None and not globally_used[i]:
                    continue  # unused on every rank: leave .grad as it was, as PyTorch does
                if self.gradient_as_bucket_view:
                    if param.grad is not view:  # usually it already is, since `_mark_ready`
                        param.grad = view
                elif param.grad is None:
                    param.grad = view.clone()
                else:
                    grads.append(param.grad)
                    views.append(view)
            # One call copies them all: a Python-level copy_ per parameter costs more than the copy
            # itself for small parameters (ResNet50 has 161, half of them BatchNorm vectors).
            if grads:
                torch._foreach_copy_(grads, views)
