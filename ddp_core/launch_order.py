"""Launching buckets in order: bucket i's reduction starts only after bucket i-1's (paper, section 3.2.3).

Every rank must issue its collectives in the same order, or they mismatch and hang; gradients may
complete buckets out of order, so a complete bucket waits for the ones before it. A launch is the plain
all-reduce, round-robin over the process groups (paper, section 3.3), or the registered comm hook.

A part of `Reducer` (see reducer.py): it owns `_next_bucket`, `buckets_reduced`, `comm_hook` and
`comm_state`; the ready hooks call `_launch_complete_buckets` when a bucket completes.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from .grad_bucket import GradBucket


class InOrderLaunch:
    """Start the reduction of complete buckets, strictly in bucket order."""

    def _init_launch(self) -> None:
        """No bucket launched yet; the plain all-reduce until a comm hook is registered."""
        self._next_bucket = 0
        self.buckets_reduced = 0  # in the latest synchronised backward (skip_unused leaves some out)
        self.comm_hook: Callable | None = None
        self.comm_state: object = None

    def _launch_complete_buckets(self) -> None:
        # Bucket i is launched only after bucket i-1, even if it completed first: same order everywhere.
        while self._next_bucket < len(self.buckets) and self.buckets[self._next_bucket].pending == 0:
            bucket = self.buckets[self._next_bucket]
            if self._next_bucket == 0:
                self.times.mark("backward_comm_start")
            if self.skip_unused and all(i in self._unreached for i in bucket.param_indices):
                # skip_all_reduce_unused_params: no rank used these (the user's promise), so no rank sends.
                bucket.future = _done_future(bucket.buffer())
            else:
                bucket.future = self._send(bucket)
                self.buckets_reduced += 1
            if self.observer is not None:
                self.observer.bucket_launched(bucket.index(), bucket.future)
            self._next_bucket += 1

    def _send(self, bucket: GradBucket) -> torch.futures.Future:
        """Start reducing `bucket` (the plain all-reduce, or the comm hook); the future of its result."""
        if self.comm_hook is None:
            # Round-robin: consecutive buckets go to different groups, i.e. concurrent channels.
            group = self.groups[bucket.index() % len(self.groups)]
            # Already divided: sum, in place in the bucket. The work's own future is kept (it
            # completes with [bucket.flat]): a `.then()` to unwrap it would run a Python callback,
            # which needs the GIL, on Gloo's thread in the middle of backward.
            return dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
        future = self.comm_hook(self.comm_state, bucket)
        # (torch._C.Future: collectives' futures are not the Python subclass torch.futures.Future)
        if not isinstance(future, torch._C.Future):
            # Surfaces at the end of backward, like a hook's own failure, once the other buckets are
            # done; the message starts as PyTorch's.
            future = _failed_future(RuntimeError(
                f"callback must return a torch.futures.Future object, but got {type(future).__qualname__} "
                f"(ddp_core: from the communication hook {getattr(self.comm_hook, '__qualname__', self.comm_hook)!r})"
            ))
        return future


def _done_future(value) -> torch.futures.Future:
    future = torch.futures.Future()
    future.set_result(value)
    return future


def _failed_future(error: Exception) -> torch.futures.Future:
    future = torch.futures.Future()
    future.set_exception(error)
    return future
