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

This file is the coordinator: it arms, detects the end of backward and runs the end's steps in order.
Each mechanism lives in a part of its own, which the `Reducer` is made of (they share the reducer's
state, each owning what its docstring names):

- `bucket_layout`: the buckets' flat buffers and where each gradient lives in them;
- `ready_hooks`: the per-parameter autograd hooks, a gradient into its bucket (the hot path);
- `launch_order`: bucket i launched only after bucket i-1; all-reduce, round-robin or comm hook;
- `write_back`: waiting for each bucket and writing `.grad`, the used-parameter bitmap;
- `rebuild`: buckets rebuilt once in the order gradients arrived (and re-bucketing under new caps);
- `static_graph`: `static_graph=True`, the graph learned in the first backward;
- `observer` and `timing`: what the reducer tells observers during backward, and its logging figures.

A sparse gradient (nn.Embedding(sparse=True)) is reduced as it is, in a bucket of its own.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .bucket_layout import BucketLayout
from .grad_bucket import GradBucket, empty_sparse_like
from .launch_order import InOrderLaunch
from .observer import ReducerObserver
from .ready_hooks import ReadyHooks
from .rebuild import BucketRebuild
from .static_graph import StaticGraph
from .timing import IterationTimes
from .write_back import WriteBack

__all__ = ["Reducer", "ReducerObserver"]  # (ReducerObserver lives in observer.py; the suite imports it from here)


class Reducer(BucketLayout, ReadyHooks, InOrderLaunch, WriteBack, BucketRebuild, StaticGraph):
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
        self._output_hooks: list = []  # handles of the pre-hooks on the latest forward's output nodes
        self.times = IterationTimes()  # what `logging_data` reports
        # Optional timing observer (the benchmark harness sets one); see `ReducerObserver`.
        self.observer: ReducerObserver | None = None
        # ddp_core's own observer, apart from the harness's: the bucket-cap tuner while it measures.
        self.tuner: ReducerObserver | None = None
        self._armed = False  # a synchronised backward is expected (set by forward)
        self._started = False  # some parameter received its gradient in the armed backward
        self._end_queued = False  # the end-of-backward callback is queued

        self._init_ready_hooks()
        self._init_launch()
        # Before the first backward, guess that gradients arrive in reverse registration order.
        self.build_buckets(list(reversed(range(len(params)))))
        self._init_rebuild(rebuild_buckets)
        self._init_static_graph()
        self._register_ready_hooks()

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
            unreached = self._arm_static_graph()
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

    # --- the end of backward ---

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

    def _finish_backward(self) -> None:
        self._armed = False
        self.times.mark("backward_compute_end")
        if self.observer is not None:
            self.observer.backward_computed()
        if self.tuner is not None:
            self.tuner.backward_computed()
        learned_now = self._finish_learning_graph()
        self._check_every_gradient_ready()
        if not self.overlap:
            self._launch_complete_buckets()  # the paper's baseline: reduce only after backward
        # Which gradients to write back: those used on some rank. With a static graph, that is known
        # after the first backward, and a parameter no rank used keeps its .grad, as in PyTorch.
        used = self._static_used
        if learned_now or (self.find_unused_parameters and not self.static_graph):
            used = self._used_on_some_rank(self._locally_used)
            if learned_now:
                self._static_used = used
        self._wait_and_write_back(used)
        self._locally_used = [False] * len(self.params)
        self.times.mark("backward_comm_end")
        self.times.iteration_done(self._ready_order)
        self._ready_order = []
        if self.observer is not None:
            self.observer.gradients_synchronised()
        if self.tuner is not None:
            self.tuner.gradients_synchronised()

    # --- join: a rank out of inputs ---

    def shadow_backward(self) -> None:
        """On a rank that ran out of inputs (join): the collectives of one synchronised backward, in the
        same order, contributing zeros; its own gradients are left alone."""
        futures = []
        for bucket in self.buckets:
            zeros = GradBucket(bucket.index(), bucket.parameters(), bucket.param_indices, bucket.is_last(),
                               sparse=bucket.sparse)
            if bucket.sparse:
                zeros.set_buffer(empty_sparse_like(bucket.parameters()[0]))
            futures.append(self._send(zeros))
        if self._learning_graph or (self.find_unused_parameters and not self.static_graph):
            used = self._used_on_some_rank([False] * len(self.params))  # (this rank used none)
            if self._learning_graph:  # this rank never ran a backward: learn what the others used
                self._learn_graph_from_others(used)
        for future in futures:
            future.wait()
        if self._rebuild_pending and len(self._arrival_order) != len(self.params):
            # Like the others, rebuild the buckets before the next iteration (rank 0's order wins).
            self._arrival_order = [i for bucket in self.buckets for i in bucket.param_indices]
