"""The autograd hooks: a gradient is ready, it goes into its bucket (paper, sections 3.2.3 and 4.2).

One post-accumulate-grad hook per parameter fires when autograd has put the parameter's gradient in
`.grad`; it copies the gradient into its bucket (divided by the world size on the way in) and, once the
bucket is complete, hands over to the in-order launch (`launch_order`). The first gradient of a
synchronised backward starts it: it marks ready the parameters forward did not reach, so that their
buckets are not waited on forever. This is the hot path: it runs once per parameter per backward, on
autograd's critical path, so it reads the reducer's attributes directly and calls nothing it need not.

A part of `Reducer` (see reducer.py): it owns the readiness of this backward (`_ready`, `_ready_order`,
`_unreached`, `_create_graph`), the used-parameter bitmap (`_locally_used`), what gradients are divided
by (`_scale`, `_divisor`, join's `_active_ranks_work`) and the hook handles.
"""
from __future__ import annotations

from typing import Callable

import torch

from .grad_bucket import empty_sparse_like


class ReadyHooks:
    """Per-parameter ready hooks: mark a gradient ready, bucket it, launch complete buckets."""

    def _init_ready_hooks(self) -> None:
        """The readiness state before any backward, and the scale gradients are divided by."""
        # 1 / world size as a ready-made 0-dim tensor: given a Python float, torch.mul wraps it in a new
        # tensor on every call, which costs as much as multiplying a small gradient (~2 us, once per
        # parameter per backward). Float64 keeps the result bit-equal to multiplying by the float.
        self._scale = self._default_scale = torch.tensor(1.0 / self.world_size, dtype=torch.float64)
        self._divisor = self.world_size  # what gradients are divided by in this backward (join may lower it)
        self._active_ranks_work = None  # join: the all-reduce that counts the ranks still training
        self._ready_order: list[int] = []  # this backward's, for the logging data
        self._create_graph = False  # backward(create_graph=True): gradients have graphs of their own
        self._ready = [False] * len(self.params)
        self._unreached: list[int] = []
        # Used-parameter bitmap: kept across no_sync() iterations, reset after each synchronisation.
        self._locally_used = [False] * len(self.params)

    def _register_ready_hooks(self) -> None:
        """One post-accumulate-grad hook per parameter (the static graph's kind, if declared)."""
        self._hook_handles = [p.register_post_accumulate_grad_hook(self._hook_for(i)) for i, p in enumerate(self.params)]

    def _hook_for(self, index: int) -> Callable[[torch.Tensor], None]:
        # The method is chosen once here, not per gradient (a sparse gradient is reduced as it is).
        mark = self._mark_sparse_ready if self.sparse[index] else self._mark_ready
        if self.static_graph:
            return self._static_graph_hook_for(index, mark)

        def hook(param: torch.Tensor) -> None:
            self._locally_used[index] = True
            if not self._armed:  # inside no_sync(), or a backward ddp_core's forward did not start
                return
            if not self._started:
                self._start_backward()
            if self._rebuild_pending:
                self._arrival_order.append(index)
            mark(index)

        return hook

    def _start_backward(self) -> None:
        self._started = True
        if self._active_ranks_work is not None:
            # join(divide_by_initial_world_size=False): average over the ranks still training (a wait on
            # the all-reduce that forward started; it has long finished by now).
            self._active_ranks_work.wait()
            self._divisor = max(1, int(self._active_ranks_work.result()[0].item()))
            self._scale = torch.tensor(1.0 / self._divisor, dtype=torch.float64)
        self._create_graph = torch.is_grad_enabled()  # backward turns grad mode on only for create_graph
        if not self._end_queued:  # no output node was reached first (a parameter used outside forward)
            self._queue_end()
        # Parameters forward did not reach never get a hook call; mark them ready now so that their
        # buckets do not wait for them forever.
        for index in self._unreached:
            (self._mark_sparse_ready if self.sparse[index] else self._mark_ready)(index)

    def _second_gradient(self, index: int) -> RuntimeError:
        return RuntimeError(
            f"ddp_core: Expected to mark a variable ready only once, but parameter {self.names[index]!r} "
            "received its gradient twice in one backward: it takes part in several reentrant backward "
            "passes (a layer checkpointed twice with use_reentrant=True, a weight shared across "
            "checkpoints), or find_unused_parameters=True could not see it behind a reentrant "
            "checkpoint. If the graph is the same in every iteration, pass static_graph=True"
        )

    def _mark_ready(self, index: int) -> None:
        if self._ready[index]:
            raise self._second_gradient(index)
        self._ready[index] = True
        self._ready_order.append(index)
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
            if self._create_graph:
                # The gradient has a graph of its own: reduce its value (the higher-order part is not
                # synchronised, as in PyTorch's DDP); out= refuses a tensor that needs grad.
                grad = grad.detach()
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
        if self.tuner is not None:
            self.tuner.parameter_ready(index)
        bucket.pending -= 1
        if bucket.pending == 0 and self.overlap:
            self._launch_complete_buckets()

    def _mark_sparse_ready(self, index: int) -> None:
        """A sparse gradient is its bucket's buffer: all-reduced as indices and values, as PyTorch does."""
        if self._ready[index]:
            raise self._second_gradient(index)
        self._ready[index] = True
        self._ready_order.append(index)
        bucket, _ = self._location[index]
        param = self.params[index]
        grad = param.grad
        if grad is None:  # unused here: contribute an empty gradient of the same layout
            grad = empty_sparse_like(param)
        elif self._divide:
            grad = grad / self._divisor
        bucket.set_buffer(grad)
        if self.observer is not None:
            self.observer.parameter_ready(index)
        if self.tuner is not None:
            self.tuner.parameter_ready(index)
        bucket.pending -= 1
        if self.overlap:
            self._launch_complete_buckets()

    def _check_every_gradient_ready(self) -> None:
        """At the end of backward: a parameter still not ready would leave its bucket unreduced; raise,
        naming it, after the buckets already launched have finished."""
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
