"""The reducer: gradient synchronisation overlapped with backward (paper, sections 3.2 and 4.2).

Life of one synchronised iteration:
1. forward: `prepare_for_backward(unreached, output_nodes)` arms the reducer (and names parameters
   forward did not reach, when unused-parameter detection is on); a new forward re-arms it, as PyTorch's
   does, so a forward whose output never gets a backward is harmless;
2. backward: a post-accumulate-grad hook per parameter copies its gradient into its bucket and, once a
   bucket is complete, launches the bucket's asynchronous all-reduce - strictly in bucket order, since
   every rank must issue collectives in the same order or they mismatch and hang;
3. end of backward (an autograd engine callback, queued on the backward that reached the forward's
   output, so that the inner backward of a reentrant checkpoint does not end it early): wait for each
   bucket in turn and write its averaged gradients back to `.grad`.

With `static_graph`, the first synchronised backward only counts how often each parameter's hook fires
and reduces everything at its end; later ones mark a parameter ready at its last expected call (a layer
checkpointed twice, a weight shared across reentrant backward passes) and parameters that were unused
then are ready from the start. A sparse gradient (nn.Embedding(sparse=True)) is reduced as it is, in a
bucket of its own.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Protocol

import torch
import torch.distributed as dist

from .bucketing import TensorSpec, assign_buckets
from .grad_bucket import GradBucket
from .timing import IterationTimes


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
        static_graph: bool = False,
        sparse: list[bool] | None = None,
        cap_list_mb: list[float] | None = None,
        skip_unused: bool = False,
    ):
        self.params = params
        self.names = names
        self.groups = groups
        self.bucket_cap_mb = bucket_cap_mb
        self.first_bucket_cap_mb = first_bucket_cap_mb
        self.cap_list_mb = cap_list_mb  # PyTorch's bucket_cap_mb_list: one cap per bucket, the last repeating
        self.skip_unused = skip_unused  # PyTorch's skip_all_reduce_unused_params
        self.overlap = overlap
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.find_unused_parameters = find_unused_parameters
        self.static_graph = static_graph
        self.sparse = sparse if sparse is not None else [False] * len(params)
        self.world_size = dist.get_world_size(groups[0])
        # 1 / world size as a ready-made 0-dim tensor: given a Python float, torch.mul wraps it in a new
        # tensor on every call, which costs as much as multiplying a small gradient (~2 us, once per
        # parameter per backward). Float64 keeps the result bit-equal to multiplying by the float.
        self._scale = self._default_scale = torch.tensor(1.0 / self.world_size, dtype=torch.float64)
        self._divisor = self.world_size  # what gradients are divided by in this backward (join may lower it)
        self._active_ranks_work = None  # join: the all-reduce that counts the ranks still training
        self._output_hooks: list = []  # handles of the pre-hooks on the latest forward's output nodes
        self.times = IterationTimes()  # what `logging_data` reports
        self.buckets_reduced = 0  # in the latest synchronised backward (skip_unused leaves some out)
        self.comm_hook: Callable | None = None
        self.comm_state: object = None
        # Optional timing observer (the benchmark harness sets one); see `ReducerObserver`.
        self.observer: ReducerObserver | None = None
        # ddp_core's own observer, apart from the harness's: the bucket-cap tuner while it measures.
        self.tuner: ReducerObserver | None = None

        # Before the first backward, guess that gradients arrive in reverse registration order.
        self.build_buckets(list(reversed(range(len(params)))))
        # PyTorch does not rebuild with unused-parameter detection (the arrival order may vary) unless
        # the graph is declared static.
        self._rebuild_enabled = rebuild_buckets
        self._rebuild_pending = rebuild_buckets and (static_graph or not find_unused_parameters)
        self._arrival_order: list[int] = []
        self._ready_order: list[int] = []  # this backward's, for the logging data
        self.rebuilt_layout: dict[str, str] = {}  # the logging data's description of the rebuilt buckets
        # Static graph: the first synchronised backward counts hook calls per parameter; later ones
        # count down a copy of those counts.
        self._learning_graph = static_graph
        self._calls = [0] * len(params)
        self._calls_left: list[int] = []
        self._never_used: list[int] = []  # by this rank, in the first backward
        self._static_used: list[int] | None = None  # by some rank, in the first backward

        self._armed = False  # a synchronised backward is expected (set by forward)
        self._started = False  # some parameter received its gradient in the armed backward
        self._end_queued = False  # the end-of-backward callback is queued
        self._create_graph = False  # backward(create_graph=True): gradients have graphs of their own
        self._ready = [False] * len(params)
        self._unreached: list[int] = []
        # Used-parameter bitmap: kept across no_sync() iterations, reset after each synchronisation.
        self._locally_used = [False] * len(params)
        self._next_bucket = 0
        self._hook_handles = [p.register_post_accumulate_grad_hook(self._hook_for(i)) for i, p in enumerate(params)]

    def set_static_graph(self) -> None:
        """Declare the graph static after construction (PyTorch's `_set_static_graph`): only before the
        first synchronised iteration, which then learns the graph."""
        if self.times.iterations or self._started or self._arrival_order:
            raise RuntimeError("ddp_core: DDP static graph (_set_static_graph) should be called before training "
                               "loop starts; pass static_graph=True to the constructor instead")
        self.static_graph = self._learning_graph = True
        self._rebuild_pending = self._rebuild_enabled
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = [p.register_post_accumulate_grad_hook(self._hook_for(i)) for i, p in enumerate(self.params)]

    # --- bucket layout ---

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
        once, between iterations, with the same caps on every rank)."""
        self.bucket_cap_mb, self.first_bucket_cap_mb = bucket_cap_mb, first_bucket_cap_mb
        self.build_buckets(self.order)
        self._describe_rebuilt()

    def _describe_rebuilt(self) -> None:
        self.rebuilt_layout = {  # as PyTorch's logging data describes rebuilt buckets
            "rebuilt_bucket_sizes": ", ".join(str(0 if b.sparse else b.flat.numel() * b.flat.element_size())
                                              for b in self.buckets),
            "rebuilt_per_bucket_param_indices": ", ".join(" ".join(map(str, b.param_indices)) for b in self.buckets),
        }

    # --- one iteration ---

    def forward_started(self) -> None:
        """A synchronised forward begins (timing only; the previous iteration's figures are published)."""
        self.times.publish()
        self.times.mark("forward_start")

    def forward_ended(self) -> None:
        """The forward's module call returned; what follows until backward ends is backward compute
        (PyTorch counts the loss there too)."""
        self.times.mark("backward_compute_start")

    def prepare_for_backward(self, unreached: list[int], output_nodes: list, active_ranks=None) -> None:
        """Arm the reducer for the backward of the forward just run; `unreached` get no gradient.

        `output_nodes` are the autograd nodes of the forward's outputs: the backward that reaches them
        is the one whose end finishes synchronisation. A forward whose output got no backward is
        simply forgotten, as in PyTorch's DDP. `active_ranks`: under join with
        divide_by_initial_world_size=False, the work whose result counts the ranks still training.
        """
        if self._armed and self._started:
            # A backward raised after some gradients were bucketed (and maybe sent): the buckets are
            # in an unknown state, so refuse, as PyTorch's DDP does.
            raise RuntimeError(
                "ddp_core: Expected to have finished reduction in the prior iteration before starting a "
                "new one: the previous backward raised before gradient synchronisation finished"
            )
        self._armed = True
        self._started = False
        self._end_queued = False
        self._ready = [False] * len(self.params)
        self._ready_order = []
        if self.static_graph:
            # The first backward learns the graph and marks everything at its end; afterwards, the
            # parameters it did not use are the unreached ones, and no graph search is needed.
            unreached = [] if self._learning_graph else self._never_used
            self._calls_left = list(self._calls)
        self._unreached = unreached
        self._next_bucket = 0
        self._active_ranks_work = active_ranks
        self._scale, self._divisor = self._default_scale, self.world_size
        self.buckets_reduced = 0
        # Without a comm hook, gradients are divided by the world size on their way into the bucket (see
        # `_mark_ready`); decided once per backward rather than once per parameter.
        self._divide = self.comm_hook is None and self.world_size > 1
        for bucket in self.buckets:
            bucket.start_iteration()
        # A node pre-hook costs one Python call per backward; it lives and dies with this forward's graph.
        # The previous forward's pre-hooks go: a module that returns the same (cached) tensor every
        # forward would otherwise pile one more hook per iteration onto the same node.
        for handle in self._output_hooks:
            handle.remove()
        self._output_hooks = [node.register_prehook(self._output_reached) for node in output_nodes]

    def _output_reached(self, grad_outputs):
        # Backward reached the forward's output, so this is the outermost backward of the iteration
        # (a reentrant checkpoint's inner backward runs inside it): synchronisation ends with it.
        if self._armed and not self._end_queued:
            self._queue_end()

    def _queue_end(self) -> None:
        self._end_queued = True
        # Runs once the current backward pass has finished, on the thread that finished it.
        torch.autograd.Variable._execution_engine.queue_callback(self._backward_ended)

    def _backward_ended(self) -> None:
        self._end_queued = False
        # A backward that gave no parameter a gradient (torch.autograd.grad with respect to the
        # inputs) leaves the reducer armed for the next one.
        if self._armed and self._started:
            self._finish_backward()

    def _hook_for(self, index: int) -> Callable[[torch.Tensor], None]:
        mark = self._mark_sparse_ready if self.sparse[index] else self._mark_ready

        def hook(param: torch.Tensor) -> None:
            self._locally_used[index] = True
            if not self._armed:  # inside no_sync(), or a backward ddp_core's forward did not start
                return
            if not self._started:
                self._start_backward()
            if self._rebuild_pending:
                self._arrival_order.append(index)
            mark(index)

        def static_graph_hook(param: torch.Tensor) -> None:
            self._locally_used[index] = True
            if not self._armed:
                return
            if not self._started:
                self._start_backward()
            if self._learning_graph:  # first backward: count calls; everything is reduced at its end
                if self._calls[index] == 0 and self._rebuild_pending:
                    self._arrival_order.append(index)
                self._calls[index] += 1
                return
            self._calls_left[index] -= 1
            if self._calls_left[index] <= 0:  # its last expected call (one too many: `mark` refuses)
                mark(index)

        return static_graph_hook if self.static_graph else hook

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
            grad = _empty_sparse_like(param)
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

    @property
    def has_rebuilt_buckets(self) -> bool:
        """Whether the buckets were rebuilt in the order gradients arrived (after the first backward)."""
        return not self._rebuild_pending and bool(self._arrival_order)

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

    def shadow_backward(self) -> None:
        """On a rank that ran out of inputs (join): the collectives of one synchronised backward, in the
        same order, contributing zeros; its own gradients are left alone."""
        futures = []
        for bucket in self.buckets:
            zeros = GradBucket(bucket.index(), bucket.parameters(), bucket.param_indices, bucket.is_last(),
                               sparse=bucket.sparse)
            if bucket.sparse:
                zeros.set_buffer(_empty_sparse_like(bucket.parameters()[0]))
            futures.append(self._send(zeros))
        if self._learning_graph or (self.find_unused_parameters and not self.static_graph):
            flags = torch.zeros(len(self.params), dtype=torch.int32, device=self.params[0].device)
            dist.all_reduce(flags, group=self.groups[0])
            if self._learning_graph:  # this rank never ran a backward: learn what the others used
                self._learning_graph = False
                self._never_used = list(range(len(self.params)))
                self._static_used = flags.tolist()
        for future in futures:
            future.wait()
        if self._rebuild_pending and len(self._arrival_order) != len(self.params):
            # Like the others, rebuild the buckets before the next iteration (rank 0's order wins).
            self._arrival_order = [i for bucket in self.buckets for i in bucket.param_indices]

    def _finish_backward(self) -> None:
        self._armed = False
        self.times.mark("backward_compute_end")
        if self.observer is not None:
            self.observer.backward_computed()
        if self.tuner is not None:
            self.tuner.backward_computed()
        learned_now = self._learning_graph
        if learned_now:
            # Static graph, first iteration: every gradient is final only now. Remember the graph,
            # then bucket (and, with overlap, launch) everything; bucket rebuilding sees the unused
            # parameters first, since later backward passes mark them ready first.
            self._learning_graph = False
            self._never_used = [i for i, calls in enumerate(self._calls) if calls == 0]
            if self._rebuild_pending:
                self._arrival_order[:0] = self._never_used
            for index in range(len(self.params)):
                (self._mark_sparse_ready if self.sparse[index] else self._mark_ready)(index)
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
        # Which gradients to write back: those used on some rank. With a static graph, that is known
        # after the first backward, and a parameter no rank used keeps its .grad, as in PyTorch.
        used = self._static_used
        if learned_now or (self.find_unused_parameters and not self.static_graph):
            flags = torch.tensor(self._locally_used, dtype=torch.int32, device=self.params[0].device)
            dist.all_reduce(flags, group=self.groups[0])
            used = flags.tolist()
            if learned_now:
                self._static_used = used
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
            # With find_unused_parameters the blocking flags all-reduce above has mostly waited already.
            self._write_back(bucket, used)
        self._locally_used = [False] * len(self.params)
        self.times.mark("backward_comm_end")
        self.times.iteration_done(self._ready_order)
        self._ready_order = []
        if self.observer is not None:
            self.observer.gradients_synchronised()
        if self.tuner is not None:
            self.tuner.gradients_synchronised()

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


def _empty_sparse_like(param: torch.Tensor) -> torch.Tensor:
    """A sparse gradient with no entries, shaped like `param`'s (what a rank that did not use it sends)."""
    return torch.sparse_coo_tensor(
        torch.empty(1, 0, dtype=torch.int64, device=param.device),
        torch.empty((0, *param.shape[1:]), dtype=param.dtype, device=param.device),
        param.shape,
    )


def _done_future(value) -> torch.futures.Future:
    future = torch.futures.Future()
    future.set_result(value)
    return future


def _failed_future(error: Exception) -> torch.futures.Future:
    future = torch.futures.Future()
    future.set_exception(error)
    return future
