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
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .hooks import check_hook
from .reducer import Reducer


class DDPError(RuntimeError, ValueError):
    """Bad use that PyTorch's DDP reports as RuntimeError and ddp_core first reported as ValueError:
    catching either works."""


class DistributedDataParallel(nn.Module):
    """Data-parallel wrapper with PyTorch DDP's arguments, plus the paper's knobs as keywords.

    `overlap=False` reduces the same buckets only after backward (the paper's no-overlap baseline);
    `first_bucket_cap_mb` caps the first bucket; `rebuild_buckets` re-buckets once, after the first
    iteration, in gradient arrival order; `process_group` may be a list of groups over the same ranks,
    used round-robin by bucket. `static_graph=True` promises the same graph in every iteration, as in
    PyTorch (see the reducer).
    """

    def __init__(
        self,
        module: nn.Module,
        device_ids: Sequence[int | torch.device] | None = None,
        process_group: dist.ProcessGroup | Sequence[dist.ProcessGroup] | None = None,
        broadcast_buffers: bool = True,
        bucket_cap_mb: float = 25,
        find_unused_parameters: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        *,
        overlap: bool = True,
        first_bucket_cap_mb: float = 1,
        rebuild_buckets: bool = True,
    ):
        super().__init__()
        _check_cap("bucket_cap_mb", bucket_cap_mb)
        _check_cap("first_bucket_cap_mb", first_bucket_cap_mb)
        named = _synchronised_parameters(module)
        if not named:
            raise DDPError(
                f"ddp_core: module {type(module).__name__} has no parameters that require gradients; "
                "there is nothing to synchronise"
            )
        groups = _as_group_list(process_group)
        self.module = module
        self.device_ids = _check_device_ids(device_ids, named[0][1])
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.require_backward_grad_sync = True
        _check_backend_fits(groups[0], named[0][1].device)
        # What the reducer is built from, kept so that unpickling can rebuild it.
        self._reducer_options = dict(
            bucket_cap_mb=bucket_cap_mb, first_bucket_cap_mb=first_bucket_cap_mb, overlap=overlap,
            gradient_as_bucket_view=gradient_as_bucket_view, find_unused_parameters=find_unused_parameters,
            rebuild_buckets=rebuild_buckets, static_graph=static_graph,
        )

        _check_same_parameters(named, groups[0])
        # Replicas start equal: everything rank 0 has, every rank gets (ignored parameters excepted).
        ignored = _ignored_names(module)
        kept = [p.detach() for name, p in module.named_parameters() if name not in ignored]
        _FlatBroadcast(kept, groups[0])()
        self._connect(groups)
        self._buffer_broadcast()

    def _connect(self, groups: list[dist.ProcessGroup]) -> None:
        """Build what belongs to this process: the buffer broadcast and the reducer over `groups`."""
        self._groups = groups
        self.process_group = groups[0]
        ignored = _ignored_names(self.module)
        # Buffers are listed once, as PyTorch's DDP does (walking the module tree costs more than
        # the broadcast's copies); buffers registered or replaced after wrapping are not broadcast.
        buffers = [b for name, b in self.module.named_buffers() if name not in ignored]
        self._buffer_broadcast = _FlatBroadcast(buffers, groups[0])
        named = _synchronised_parameters(self.module)
        sparse = _sparse_gradient_parameters(self.module)
        self.reducer = Reducer(
            params=[p for _, p in named],
            names=[name for name, _ in named],
            groups=groups,
            sparse=[id(p) in sparse for _, p in named],
            **self._reducer_options,
        )

    def __getstate__(self) -> dict:
        """Pickle without process groups and reducer: they belong to this process and group."""
        if self._groups != [dist.group.WORLD]:
            raise DDPError(
                "ddp_core: pickling is supported only with the default process group (as in PyTorch's "
                "DDP): the groups given to the constructor cannot be rebuilt when loading"
            )
        state = self.__dict__.copy()
        for key in ("_groups", "process_group", "_buffer_broadcast", "reducer"):
            del state[key]
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
        self.reducer.maybe_rebuild_buckets()
        if self.broadcast_buffers:
            # BatchNorm statistics and the like: rank 0's are the truth (a sync point per forward).
            self._buffer_broadcast()
        if self.device_ids:
            inputs, kwargs = _move_to(self.device_ids[0], (inputs, kwargs))
        output = self.module(*inputs, **kwargs)
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            tensors = list(_tensors_in(output))
            search = self.find_unused_parameters and not self.static_graph  # a static graph is known
            unreached = _unreached_parameters(tensors, self.reducer.params) if search else []
            self.reducer.prepare_for_backward(unreached, [t.grad_fn for t in tensors if t.grad_fn is not None])
        return output

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
            raise RuntimeError("ddp_core: register_comm_hook may be called only once")
        self.reducer.comm_hook, self.reducer.comm_state = hook, state


def _ignored_names(module: nn.Module) -> set[str]:
    return set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))


def _synchronised_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The (name, parameter) pairs DDP reduces: trainable and not ignored."""
    ignored = _ignored_names(module)
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad and name not in ignored]


def _sparse_gradient_parameters(module: nn.Module) -> set[int]:
    """Ids of the parameters whose gradient will be sparse, known from their module as in PyTorch's DDP."""
    return {id(m.weight) for m in module.modules() if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse}


def _check_cap(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{name} must be a number >= 0 (0 means one parameter per bucket), got {value!r}")


def _as_group_list(process_group) -> list[dist.ProcessGroup]:
    if not dist.is_initialized():
        raise RuntimeError("ddp_core: call torch.distributed.init_process_group before wrapping a module")
    if process_group is None:
        return [dist.group.WORLD]
    if isinstance(process_group, (list, tuple)):
        groups = list(process_group)
        if not groups:
            raise ValueError("process_group: an empty list of groups was given")
        sizes = {dist.get_world_size(g) for g in groups}
        if len(sizes) != 1:
            raise ValueError(f"process_group: round-robin groups must span the same ranks, got sizes {sorted(sizes)}")
        return groups
    return [process_group]


def _check_device_ids(device_ids, param: torch.Tensor) -> list[torch.device] | None:
    if device_ids is None:
        return None
    if param.device.type == "cpu":
        raise ValueError(f"device_ids must be None for a module on the CPU, got {device_ids!r}")
    if len(device_ids) != 1:
        raise ValueError(f"device_ids must hold exactly one device (single-device modules only), got {device_ids!r}")
    device = torch.device(param.device.type, device_ids[0]) if isinstance(device_ids[0], int) else torch.device(device_ids[0])
    if device != param.device:
        raise ValueError(f"device_ids={device_ids!r} does not match the module's device {param.device}")
    return [device]


def _check_backend_fits(group: dist.ProcessGroup, device: torch.device) -> None:
    backend = dist.get_backend(group)
    if backend == "nccl" and device.type != "cuda":
        raise ValueError(f"ddp_core: the NCCL backend reduces only CUDA tensors, but the module is on {device}")


def _check_same_parameters(named: list[tuple[str, torch.Tensor]], group: dist.ProcessGroup) -> None:
    """Fail on every rank, naming the first difference, if the ranks do not hold the same model."""
    signature = [(name, tuple(p.shape), str(p.dtype)) for name, p in named]
    gathered: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, signature, group=group)
    reference = gathered[0]
    for rank, other in enumerate(gathered[1:], start=1):
        if other == reference:
            continue
        if len(other) != len(reference):
            detail = f"{len(reference)} trainable parameters on rank 0, {len(other)} on rank {rank}"
        else:
            first = next(i for i, (a, b) in enumerate(zip(reference, other)) if a != b)
            detail = f"parameter {first}: {reference[first]} on rank 0, {other[first]} on rank {rank}"
        raise DDPError(f"ddp_core: the ranks hold different models ({detail})")


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
    def __call__(self) -> None:
        for tensors, flat, views in self.kinds:
            if self.is_src:  # rank 0 sends its values and keeps them
                torch._foreach_copy_(views, tensors)
            dist.broadcast(flat, src=self.src, group=self.group)
            if not self.is_src:
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
