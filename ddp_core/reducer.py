"""The reducer: gradient synchronisation overlapped with backward (paper, sections 3.2 and 4.2).

Life of one synchronised iteration:
1. forward: `prepare_for_backward(unreached)` arms the reducer (and names parameters forward did not
   reach, when unused-parameter detection is on);
2. backward: a post-accumulate-grad hook per parameter copies its gradient into its bucket and, once a
   bucket is complete, launches the bucket's asynchronous all-reduce - strictly in bucket order, since
   every rank must issue collectives in the same order or they mismatch and hang;
3. end of backward (an autograd engine callback): wait for each bucket in turn and write its averaged
   gradients back to `.grad`.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Protocol

import torch
import torch.distributed as dist

from .bucketing import TensorSpec, assign_buckets
from .grad_bucket import GradBucket


class ReducerObserver(Protocol):
    """What a timing observer is told, from autograd's threads, during backward."""

    def parameter_ready(self, index: int) -> None:
        """Parameter `index`'s gradient is in its bucket (the performance model's profile uses this)."""

    def bucket_launched(self, index: int, future: torch.futures.Future) -> None:
        """Bucket `index` was handed to its hook (or all-reduced); `future` completes when it is reduced."""

    def backward_computed(self) -> None:
        """Autograd has produced every gradient; what follows is waiting for communication."""

    def gradients_synchronised(self) -> None:
        """Averaged gradients are in .grad."""


class Reducer:
    """Buckets the gradients of `params` and averages them across `groups` during backward."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        names: list[str],
        groups: list[dist.ProcessGroup],
        bucket_cap_mb: float,
        first_bucket_cap_mb: float,
        overlap: bool,
        gradient_as_bucket_view: bool,
        find_unused_parameters: bool,
        rebuild_buckets: bool,
    ):
        self.params = params
        self.names = names
        self.groups = groups
        self.bucket_cap_mb = bucket_cap_mb
        self.first_bucket_cap_mb = first_bucket_cap_mb
        self.overlap = overlap
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.find_unused_parameters = find_unused_parameters
        self.world_size = dist.get_world_size(groups[0])
        # 1 / world size as a ready-made 0-dim tensor: given a Python float, torch.mul wraps it in a new
        # tensor on every call, which costs as much as multiplying a small gradient (~2 us, once per
        # parameter per backward). Float64 keeps the result bit-equal to multiplying by the float.
        self._scale = torch.tensor(1.0 / self.world_size, dtype=torch.float64)
        self.comm_hook: Callable | None = None
        self.comm_state: object = None
        # Optional timing observer (the benchmark harness sets one); see `ReducerObserver`.
        self.observer: ReducerObserver | None = None

        # Before the first backward, guess that gradients arrive in reverse registration order.
        self.build_buckets(list(reversed(range(len(params)))))
        # PyTorch does not rebuild with unused-parameter detection: the arrival order may vary.
        self._rebuild_pending = rebuild_buckets and not find_unused_parameters
        self._arrival_order: list[int] = []

        self._armed = False  # a synchronised backward is expected (set by forward)
        self._ready = [False] * len(params)
        self._unreached: list[int] = []
        self._unreached_marked = False
        # Used-parameter bitmap: kept across no_sync() iterations, reset after each synchronisation.
        self._locally_used = [False] * len(params)
        self._next_bucket = 0
        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(self._hook_for(i))

    # --- bucket layout ---

    def build_buckets(self, order: list[int]) -> None:
        """(Re)assign parameters to buckets, visiting them in `order`, and allocate flat buffers."""
        specs = [TensorSpec(p.numel() * p.element_size(), (p.dtype, p.device)) for p in self.params]
        assignment = assign_buckets(specs, order, self.bucket_cap_mb, self.first_bucket_cap_mb)
        self.buckets = [
            GradBucket(b, [self.params[i] for i in indices], indices, is_last=b == len(assignment) - 1)
            for b, indices in enumerate(assignment)
        ]
        self._location = {}  # parameter index -> (bucket, its gradient's view in the bucket)
        for bucket in self.buckets:
            for i, view in zip(bucket.param_indices, bucket.views):
                self._location[i] = (bucket, view)
        if self.gradient_as_bucket_view:
            with torch.no_grad():
                for bucket in self.buckets:
                    for p, view in zip(bucket.parameters(), bucket.views):
                        if p.grad is not None:
                            view.copy_(p.grad)
                            p.grad = view

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

    # --- one iteration ---

    def prepare_for_backward(self, unreached: list[int]) -> None:
        """Arm the reducer for the backward of the forward just run; `unreached` get no gradient."""
        if self._armed:
            raise RuntimeError(
                "ddp_core: a new forward started before the previous forward's backward finished "
                "gradient synchronisation; call backward on every output of a synchronised forward "
                "(or run the forward under no_sync() or torch.no_grad())"
            )
        self._armed = True
        self._ready = [False] * len(self.params)
        self._unreached = unreached
        self._unreached_marked = False
        self._next_bucket = 0
        # Without a comm hook, gradients are divided by the world size on their way into the bucket (see
        # `_mark_ready`); decided once per backward rather than once per parameter.
        self._divide = self.comm_hook is None and self.world_size > 1
        for bucket in self.buckets:
            bucket.start_iteration()

    def _hook_for(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            self._locally_used[index] = True
            if not self._armed:  # inside no_sync(), or a backward ddp_core's forward did not start
                return
            if not self._unreached_marked:
                self._start_backward()
            if self._rebuild_pending:
                self._arrival_order.append(index)
            self._mark_ready(index)

        return hook

    def _start_backward(self) -> None:
        self._unreached_marked = True
        # Runs once the whole backward pass has finished, on the thread that finished it.
        torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
        # Parameters forward did not reach never get a hook call; mark them ready now so that their
        # buckets do not wait for them forever.
        for index in self._unreached:
            self._mark_ready(index)

    def _mark_ready(self, index: int) -> None:
        if self._ready[index]:
            raise RuntimeError(
                f"ddp_core: parameter {self.names[index]!r} received its gradient twice in one backward; "
                "reentrant backward or a parameter used in several backward passes per forward is not supported"
            )
        self._ready[index] = True
        bucket, view = self._location[index]
        param = self.params[index]
        grad = param.grad
        # Copy the gradient into its bucket (unless .grad already is that view). A parameter without
        # a gradient contributes zeros; one with a gradient from no_sync() iterations contributes it.
        # Without a comm hook, divide by the world size on the way in (as PyTorch does): averaging
        # then costs no extra pass over the bucket, and the all-reduce only sums.
        # (This runs once per parameter per backward, on autograd's critical path: keep it lean.)
        if grad is None:
            view.zero_()
        elif grad.data_ptr() != view.data_ptr():
            if self._divide:
                torch.mul(grad, self._scale, out=view)  # bit-equal to PyTorch's reducer
            else:
                view.copy_(grad)
            if self.gradient_as_bucket_view:
                param.grad = view
        elif self._divide:
            view.mul_(self._scale)
        if self.observer is not None:
            self.observer.parameter_ready(index)
        bucket.pending -= 1
        if bucket.pending == 0 and self.overlap:
            self._launch_complete_buckets()

    def _launch_complete_buckets(self) -> None:
        # Bucket i is launched only after bucket i-1, even if it completed first: same order everywhere.
        while self._next_bucket < len(self.buckets) and self.buckets[self._next_bucket].pending == 0:
            bucket = self.buckets[self._next_bucket]
            if self.comm_hook is None:
                # Round-robin: consecutive buckets go to different groups, i.e. concurrent channels.
                group = self.groups[bucket.index() % len(self.groups)]
                # Already divided: sum, in place in the bucket. The work's own future is kept (it
                # completes with [bucket.flat]): a `.then()` to unwrap it would run a Python callback,
                # which needs the GIL, on Gloo's thread in the middle of backward.
                bucket.future = dist.all_reduce(bucket.flat, group=group, async_op=True).get_future()
            else:
                bucket.future = self.comm_hook(self.comm_state, bucket)
            if self.observer is not None:
                self.observer.bucket_launched(bucket.index(), bucket.future)
            self._next_bucket += 1

    def _finish_backward(self) -> None:
        self._armed = False
        if self.observer is not None:
            self.observer.backward_computed()
        missing = [self.names[i] for i, ready in enumerate(self._ready) if not ready]
        if missing:
            for bucket in self.buckets[: self._next_bucket]:
                bucket.future.wait()  # leave no collective half-done behind the error
            raise RuntimeError(
                f"ddp_core: {len(missing)} parameter(s) received no gradient in this backward: "
                f"{', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}. The module has "
                "parameters that did not contribute to the loss; pass find_unused_parameters=True, "
                "or make every parameter take part in the forward"
            )
        if not self.overlap:
            self._launch_complete_buckets()  # the paper's baseline: reduce only after backward
        used = None  # which gradients to write back: those used on some rank
        if self.find_unused_parameters:
            flags = torch.tensor(self._locally_used, dtype=torch.int32, device=self.params[0].device)
            dist.all_reduce(flags, group=self.groups[0])
            used = flags.tolist()
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
            # A hook's future holds the reduced bucket, maybe in a tensor of its own; the plain
            # all-reduce worked in place.
            if self.comm_hook is not None and result.data_ptr() != bucket.flat.data_ptr():
                bucket.flat.copy_(result)
            # Bucket by bucket, as PyTorch does: copying one bucket's gradients out overlaps with the
            # reduction of the buckets after it (BERT's last bucket alone holds 94 MB of embeddings).
            # With find_unused_parameters the blocking flags all-reduce above has mostly waited already.
            self._write_back(bucket, used)
        self._locally_used = [False] * len(self.params)
        if self.observer is not None:
            self.observer.gradients_synchronised()

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
