"""DistributedDataParallel: the module wrapper (paper, section 4).

Construction makes the replicas equal (shape check, then broadcast from rank 0) and builds the
reducer; forward broadcasts buffers and, with `find_unused_parameters`, finds the parameters the
output does not depend on; `no_sync()` skips synchronisation for gradient accumulation. Parameters
and buffers named in the module's `_ddp_params_and_buffers_to_ignore` are neither broadcast nor
reduced. Pickling (torch.save, copy.deepcopy) drops the process groups and the reducer; loading
rebuilds them on the default group, as PyTorch's DDP does.
"""
from __future__ import annotations

import dataclasses
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from .arguments import (
    DDPError,
    as_group_list,
    buffer_sync,
    check_backend_fits,
    check_cap,
    check_cap_or_auto,
    check_cap_list,
    check_device_ids,
    check_output_device,
    check_same_parameters,
    group_from_mesh,
    ignored_names,
    refuse_unsupported,
    sparse_gradient_parameters,
    synchronised_parameters,
)
from . import auto_bucket
from .hooks import check_hook
from .reducer import Reducer
from .timing import logging_data


class DistributedDataParallel(nn.Module, Joinable):
    """Data-parallel wrapper with PyTorch DDP's signature, plus the paper's knobs as keywords.

    PyTorch's parameters come in PyTorch's order (a positional call binds as it would there). Those that
    mean something with one device per process behave as PyTorch's; the others raise a DDPError that
    names them (see `refuse_unsupported`). `overlap=False` reduces the same buckets only after backward
    (the paper's no-overlap baseline); `first_bucket_cap_mb` caps the first bucket; `rebuild_buckets`
    re-buckets once, after the first iteration, in gradient arrival order; `process_group` may be a
    list of groups over the same ranks, used round-robin by bucket. `static_graph=True` promises the
    same graph in every iteration, as in PyTorch (see the reducer). Uneven inputs: `join()`.
    `bucket_cap_mb="auto"` (ddp_core only): the first synchronised iterations run on PyTorch's default caps
    while ddp_core measures them; a schedule model shortlists three layouts (cap and first bucket's cap),
    the next iterations try each, and within at most 30 iterations every rank takes the fastest measured
    one, identically (see `auto_bucket`); `get_ddp_logging_data()` says what it chose, every candidate's
    predicted iteration and every tried layout's measured one.
    """

    def __init__(
        self,
        module: nn.Module,
        device_ids: Sequence[int | torch.device] | None = None,
        output_device: int | torch.device | None = None,
        dim: int = 0,
        broadcast_buffers: bool | None = None,
        init_sync: bool = True,
        process_group: dist.ProcessGroup | Sequence[dist.ProcessGroup] | None = None,
        bucket_cap_mb: float | str | None = None,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        delay_all_reduce_named_params=None,
        param_to_hook_all_reduce=None,
        mixed_precision=None,
        device_mesh=None,
        skip_all_reduce_unused_params: bool = False,
        bucket_cap_mb_list: Sequence[float] | None = None,
        batched_grad_copy: bool = False,
        forward_sync_buffers: bool | None = None,
        *,
        overlap: bool = True,
        first_bucket_cap_mb: float = 1,
        rebuild_buckets: bool = True,
    ):
        super().__init__()
        Joinable.__init__(self)
        refuse_unsupported(delay_all_reduce_named_params=delay_all_reduce_named_params,
                            param_to_hook_all_reduce=param_to_hook_all_reduce, mixed_precision=mixed_precision,
                            batched_grad_copy=batched_grad_copy)
        if bucket_cap_mb is None:
            bucket_cap_mb = 25  # PyTorch's default
        self._auto_bucket_cap = check_cap_or_auto("bucket_cap_mb", bucket_cap_mb)
        if self._auto_bucket_cap:  # measured on PyTorch's default cap until the tuner chooses
            bucket_cap_mb = auto_bucket.DEFAULT_CAP_MB
        check_cap("first_bucket_cap_mb", first_bucket_cap_mb)
        cap_list = check_cap_list(bucket_cap_mb_list)
        if check_reduction:
            warnings.warn("The `check_reduction` argument in `DistributedDataParallel` module is deprecated "
                          "(ddp_core, as PyTorch, always checks that reduction finished). Please avoid using it.",
                          FutureWarning, stacklevel=2)
        named = synchronised_parameters(module)
        if not named:
            raise DDPError(
                f"ddp_core: module {type(module).__name__} has no parameters that require gradients; "
                "there is nothing to synchronise"
            )
        groups = as_group_list(group_from_mesh(process_group, device_mesh))
        self.module = module
        self.device_ids = check_device_ids(device_ids, named[0][1])
        self.output_device = check_output_device(output_device, self.device_ids)
        self.dim = dim  # where inputs would be scattered; one device per process scatters nothing
        self.device = named[0][1].device
        self.device_mesh = device_mesh
        forward_sync, init_sync_buffers = buffer_sync(broadcast_buffers, forward_sync_buffers)
        self.forward_sync_buffers = forward_sync
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.logged_error: str | None = None  # the message of a refusal, for the logging data
        self.skip_all_reduce_unused_params = skip_all_reduce_unused_params
        self.require_backward_grad_sync = True
        self._divide_by_initial_world_size = True  # set by the join hook
        self._join_work = None  # the join context's "not joined yet" all-reduce of this forward
        check_backend_fits(groups[0], named[0][1].device)
        # What the reducer is built from, kept so that unpickling can rebuild it.
        self._reducer_options = dict(
            bucket_cap_mb=bucket_cap_mb, first_bucket_cap_mb=first_bucket_cap_mb, overlap=overlap,
            gradient_as_bucket_view=gradient_as_bucket_view, find_unused_parameters=find_unused_parameters,
            rebuild_buckets=rebuild_buckets, static_graph=static_graph, cap_list_mb=cap_list,
            skip_unused=skip_all_reduce_unused_params,
        )
        if self._auto_bucket_cap and cap_list:
            raise ValueError(f"bucket_cap_mb='auto' chooses the caps itself; it cannot go with bucket_cap_mb_list={cap_list!r}")

        if init_sync:
            check_same_parameters(named, groups[0])
            # Replicas start equal: everything rank 0 has, every rank gets (ignored parameters excepted).
            ignored = ignored_names(module)
            kept = [p.detach() for name, p in module.named_parameters() if name not in ignored]
            _FlatBroadcast(kept, groups[0])()
        self._connect(groups)
        if init_sync and init_sync_buffers:
            self._buffer_broadcast()

    @property
    def broadcast_buffers(self) -> bool:
        """Deprecated name of `forward_sync_buffers`, kept as PyTorch keeps it."""
        return self.forward_sync_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value: bool) -> None:
        self.forward_sync_buffers = value

    def _connect(self, groups: list[dist.ProcessGroup]) -> None:
        """Build what belongs to this process: the buffer broadcast and the reducer over `groups`."""
        self._groups = groups
        self.process_group = groups[0]
        ignored = ignored_names(self.module)
        # Buffers are listed once, as PyTorch's DDP does (walking the module tree costs more than
        # the broadcast's copies); buffers registered or replaced after wrapping are not broadcast.
        buffers = [b for name, b in self.module.named_buffers() if name not in ignored]
        self._buffer_broadcast = _FlatBroadcast(buffers, groups[0])
        named = synchronised_parameters(self.module)
        sparse = sparse_gradient_parameters(self.module)
        self.reducer = Reducer(
            params=[p for _, p in named],
            names=[name for name, _ in named],
            groups=groups,
            sparse=[id(p) in sparse for _, p in named],
            **self._reducer_options,
        )
        # bucket_cap_mb="auto": the reducer's tuner (a loaded copy measures and chooses afresh)
        self._auto = auto_bucket.AutoBucket(self.reducer) if self._auto_bucket_cap else None

    def __getstate__(self) -> dict:
        """Pickle without process groups and reducer: they belong to this process and group."""
        if self._groups != [dist.group.WORLD]:
            raise DDPError(
                "ddp_core: pickling is supported only with the default process group (as in PyTorch's "
                "DDP): the groups given to the constructor cannot be rebuilt when loading"
            )
        state = self.__dict__.copy()
        for key in ("_groups", "process_group", "_buffer_broadcast", "reducer", "_auto"):
            del state[key]
        # A join context's work handles belong to this process's communication.
        state["_join_work"] = None
        state.pop("_join_flag_work", None)
        return state

    def __setstate__(self, state: dict) -> None:
        """Rebuild the reducer on the default process group (no collective: loading may happen on one rank)."""
        super().__setstate__(state)
        self._connect([dist.group.WORLD])

    @staticmethod
    def _set_params_and_buffers_to_ignore_for_model(module: nn.Module, params_and_buffers_to_ignore) -> None:
        """Name parameters and buffers (as in `module.named_parameters()`) that DDP must neither
        broadcast nor reduce; call before wrapping, as in PyTorch."""
        module._ddp_params_and_buffers_to_ignore = list(params_and_buffers_to_ignore)

    def forward(self, *inputs, **kwargs):
        """Run the wrapped module; arm gradient synchronisation for the backward that follows."""
        synchronise = torch.is_grad_enabled() and self.require_backward_grad_sync
        if synchronise:
            self.reducer.forward_started()
        # Inside `join()`: tell the ranks that ran out of inputs that this one has not (an all-reduce
        # they shadow); None outside it.
        self._join_work = Join.notify_join_context(self)
        joining = self._join_config.enable
        self.reducer.maybe_rebuild_buckets()
        if self._auto is not None and synchronise:
            if joining:  # ranks that ran out of inputs count fewer iterations: they could not agree
                self._auto.stop("join() began before the cap was chosen")
            self._auto.before_forward()  # may choose the cap and re-bucket: a collective, on every rank
        if self.forward_sync_buffers and self._buffer_broadcast.kinds:
            # BatchNorm statistics and the like: rank 0's are the truth (a sync point per forward).
            # Under join, rank 0 may have stopped training: the highest rank still training is.
            self._buffer_broadcast(self._common_rank(True) if joining else 0)
        if joining:
            # Tell the joined ranks whether this iteration's backward synchronises (they wait on it).
            flag = torch.full((1,), float(self.require_backward_grad_sync), device=self.device)
            self._join_flag_work = dist.all_reduce(flag, group=self.process_group, async_op=True)
        if self.device_ids:
            inputs, kwargs = _move_to(self.device_ids[0], (inputs, kwargs))
        output = self.module(*inputs, **kwargs)
        if synchronise:
            tensors = list(_tensors_in(output))
            search = self.find_unused_parameters and not self.static_graph  # a static graph is known
            unreached = _unreached_parameters(tensors, self.reducer.params) if search else []
            count = self._join_work if joining and not self._divide_by_initial_world_size else None
            self.reducer.prepare_for_backward(unreached, [t.grad_fn for t in tensors if t.grad_fn is not None],
                                              active_ranks=count)
            self.reducer.forward_ended()
        return output

    # --- uneven inputs (PyTorch's Joinable protocol) ---

    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False) -> Join:
        """Context manager for uneven inputs: ranks that ran out of batches shadow the others'
        collectives until every rank has; then all ranks take the model of a rank that ran longest.

        `divide_by_initial_world_size=False` averages over the ranks still training instead;
        `throw_on_early_termination=True` makes every rank raise once one runs out (as in PyTorch).
        """
        return Join([self], enable, throw_on_early_termination,
                    divide_by_initial_world_size=divide_by_initial_world_size)

    def join_hook(self, **kwargs) -> JoinHook:
        """The hook that `Join` runs on a rank out of inputs (kwargs: divide_by_initial_world_size)."""
        return _JoinHook(self, kwargs.get("divide_by_initial_world_size", True))

    @property
    def join_device(self) -> torch.device:
        """Device of the join context's own all-reduces: the module's."""
        return self.device

    @property
    def join_process_group(self) -> dist.ProcessGroup:
        """Group of the join context's own all-reduces: the reducer's (first) group."""
        return self.process_group

    def _common_rank(self, candidate: bool) -> int:
        """The highest group rank among those passing `candidate=True` (an all-reduce every rank joins)."""
        rank = torch.tensor([dist.get_rank(self.process_group) if candidate else -1], device=self.device)
        dist.all_reduce(rank, op=dist.ReduceOp.MAX, group=self.process_group)
        if rank.item() < 0:
            raise DDPError("ddp_core: join found no rank to take the model from (no candidate rank)")
        return int(rank.item())

    def _sync_final_model(self, is_last_joiner: bool) -> None:
        """Every rank takes the parameters (and buffers, if they are synchronised) of a last joiner."""
        src = self._common_rank(is_last_joiner)
        ignored = ignored_names(self.module)
        kept = [p.detach() for name, p in self.module.named_parameters() if name not in ignored]
        _FlatBroadcast(kept, self.process_group)(src)
        if self.forward_sync_buffers:
            self._buffer_broadcast(src)

    # --- what the reducer tells ---

    def get_ddp_logging_data(self) -> dict:
        """PyTorch's `_get_ddp_logging_data` figures for ddp_core: construction settings and, for the
        latest synchronised iteration and averaged over all, forward, backward compute, backward
        communication and their overlap, in nanoseconds (keys as PyTorch names them)."""
        return logging_data(self.reducer, self)

    _get_ddp_logging_data = get_ddp_logging_data  # PyTorch's (private) name, for programs written for it

    def _log_and_raise(self, error: Exception) -> None:
        """Raise `error`, keeping its message in the logging data ("has_error", "error"), as PyTorch does."""
        self.logged_error = str(error)
        raise error

    def _set_ddp_runtime_logging_sample_rate(self, sample_rate: int) -> None:
        """PyTorch's private knob: the logging data times iterations 1-10, then every `sample_rate`-th."""
        if sample_rate < 1:
            self._log_and_raise(ValueError("DDP runtime logging sample rate should be equal or greater than 1"))
        self.reducer.times.sample_rate = sample_rate

    def _set_static_graph(self) -> None:
        """PyTorch's private way to declare the graph static after construction, before training starts."""
        if self.static_graph:
            warnings.warn("You've set static_graph to be True, no need to set it again.", stacklevel=2)
            return
        try:
            self.reducer.set_static_graph()
        except RuntimeError as error:
            self._log_and_raise(error)
        self.static_graph = True

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally; the next synchronised one reduces the sum."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def register_comm_hook(self, state: object, hook: Callable) -> None:
        """Reduce buckets with `hook(state, bucket) -> Future[Tensor]` instead of the plain all-reduce."""
        check_hook(hook)
        if self.reducer.comm_hook is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once. "
                               "(ddp_core: a hook is already registered)")
        self.reducer.comm_hook, self.reducer.comm_state = hook, state


class _JoinHook(JoinHook):
    """What a rank out of inputs does for ddp_core: per iteration of the others, the same collectives
    (contributing zero gradients); at the end, take the model of a rank that ran longest."""

    def __init__(self, ddp: DistributedDataParallel, divide_by_initial_world_size: bool):
        self.ddp = ddp
        ddp._divide_by_initial_world_size = divide_by_initial_world_size

    def main_hook(self) -> None:
        """Shadow one iteration of the ranks still training, in the order their forward and backward
        issue collectives (the join context itself shadowed their "not joined" all-reduce)."""
        ddp = self.ddp
        ddp.reducer.maybe_rebuild_buckets()
        if ddp._auto is not None:
            ddp._auto.stop("join() began before the cap was chosen")
        if ddp.forward_sync_buffers and ddp._buffer_broadcast.kinds:
            ddp._buffer_broadcast(ddp._common_rank(False))
        flag = torch.zeros(1, device=ddp.device)
        dist.all_reduce(flag, group=ddp.process_group)  # does their backward synchronise?
        if flag.item() > 0:
            ddp.reducer.shadow_backward()

    def post_hook(self, is_last_joiner: bool) -> None:
        """All ranks have joined: make the replicas equal again."""
        self.ddp._sync_final_model(is_last_joiner)


# Parameters of PyTorch's DDP that ddp_core refuses, and why (a refusal names the parameter, never ignores it).
class _FlatBroadcast:
    """Copies rank 0's values into every rank's `tensors` when called: one broadcast per dtype and device.

    Each kind of tensor has a persistent flat buffer, filled and emptied with one `_foreach_copy_`:
    flattening anew, and a Python-level copy per tensor, cost more than the data for the ~160 small
    BatchNorm buffers that ResNet50 broadcasts before every forward.
    """

    def __init__(self, tensors: list[torch.Tensor], group: dist.ProcessGroup):
        self.group = group
        self.src = dist.get_global_rank(group, 0)
        self.is_src = dist.get_rank(group) == 0
        by_kind: dict[tuple, list[torch.Tensor]] = {}
        for t in tensors if dist.get_world_size(group) > 1 else []:  # alone: nothing to send, no buffers
            by_kind.setdefault((t.dtype, t.device), []).append(t)
        self.kinds = []  # (tensors, flat buffer, views of the flat buffer shaped like the tensors)
        for same_kind in by_kind.values():
            numels = [t.numel() for t in same_kind]
            flat = torch.empty(sum(numels), dtype=same_kind[0].dtype, device=same_kind[0].device)
            views = [chunk.view_as(t) for chunk, t in zip(flat.split(numels), same_kind)]
            # Written through `.data` aliases (made once): like PyTorch's broadcast, the copy is not an
            # in-place change in autograd's eyes, so a second forward before backward does not
            # invalidate the BatchNorm statistics that the first forward's graph saved.
            self.kinds.append(([t.data for t in same_kind], flat, views))

    @torch.no_grad()
    def __call__(self, src: int = 0) -> None:
        """Copy group rank `src`'s values (rank 0's unless a join picked another) into every rank's."""
        is_src, global_src = (self.is_src, self.src) if src == 0 else (
            dist.get_rank(self.group) == src, dist.get_global_rank(self.group, src))
        for tensors, flat, views in self.kinds:
            if is_src:  # the source sends its values and keeps them
                torch._foreach_copy_(views, tensors)
            dist.broadcast(flat, src=global_src, group=self.group)
            if not is_src:
                torch._foreach_copy_(tensors, views)


def _tensors_in(value) -> Iterator[torch.Tensor]:
    """Every tensor inside nested tuples (named ones too), lists, dicts and dataclasses (model outputs)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _tensors_in(getattr(value, field.name))


def _unreached_parameters(tensors: list[torch.Tensor], params: list[torch.Tensor]) -> list[int]:
    """Indices of `params` that the autograd graph of `tensors` does not reach (they get no gradient)."""
    reached: set[int] = set()
    seen: set = set()
    stack = []
    for t in tensors:
        if t.grad_fn is not None:
            stack.append(t.grad_fn)
        elif t.requires_grad:
            reached.add(id(t))  # a parameter returned as it is
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad nodes hold their leaf
        if variable is not None:
            reached.add(id(variable))
        stack.extend(next_node for next_node, _ in node.next_functions if next_node is not None)
    return [i for i, p in enumerate(params) if id(p) not in reached]


def _move_to(device: torch.device, value):
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, tuple):
        return tuple(_move_to(device, v) for v in value)
    if isinstance(value, list):
        return [_move_to(device, v) for v in value]
    if isinstance(value, dict):
        return {k: _move_to(device, v) for k, v in value.items()}
    return value
