"""What the reducer tells: per-iteration forward, backward compute, backward communication and overlap.

The same figures, under the same names, as PyTorch's DDP logs (`_get_ddp_logging_data`), measured at
the same points: forward from the start of DDP's forward to the start of backward compute (which
begins when the wrapped module returns, so the loss counts as backward, as in PyTorch); backward
compute until the last gradient is in its bucket; communication from the first bucket's launch to the
end of synchronisation; overlap from the first launch to the end of backward compute. Times are
wall-clock nanoseconds (time.time_ns), read on the CPU: on a GPU they time the launches, not kernels.
"""
from __future__ import annotations

import contextlib
import os
import time

import torch
import torch.distributed as dist

_SPANS = {  # figure -> (start mark, end mark)
    "forward_compute_time": ("forward_start", "backward_compute_start"),
    "backward_compute_time": ("backward_compute_start", "backward_compute_end"),
    "backward_comm_time": ("backward_comm_start", "backward_comm_end"),
    "backward_compute_comm_overlap_time": ("backward_comm_start", "backward_compute_end"),
}


DEFAULT_SAMPLE_RATE = 100  # PyTorch's kDDPRuntimeLoggingSampleRate
_ALWAYS_SAMPLED = 10  # PyTorch records the first 10 iterations, then every `sample_rate`-th


class IterationTimes:
    """Clock marks of the running synchronised iteration, and figures of the sampled finished ones.

    As in PyTorch's DDP: iterations 1-10 and then every `sample_rate`-th are sampled, and a sampled
    iteration's figures become visible when the next synchronised forward starts (`publish`), labelled
    with its number (`published_iteration`); the averages are over the published iterations."""

    def __init__(self):
        self._marks: dict[str, int] = {}
        self.latest: dict[str, int | str] = {}  # figures and marks of the latest published iteration
        self._sums = dict.fromkeys(_SPANS, 0)
        self.iterations = 0  # finished synchronised iterations
        self.published = 0  # of them, published into `latest` and the averages
        self.published_iteration = 0  # the number (from 1) of the iteration `latest` describes
        self.sample_rate = DEFAULT_SAMPLE_RATE
        self._pending: tuple[int, dict] | None = None  # a sampled iteration waiting for the next forward

    def mark(self, event: str) -> None:
        """Note the time of `event` in this iteration (a second mark of the same event overwrites)."""
        self._marks[event] = time.time_ns()

    def iteration_done(self, ready_order: list[int]) -> None:
        """Synchronisation finished: turn this iteration's marks into figures (kept if it is sampled);
        `ready_order`: the parameter indices in the order their gradients became ready."""
        marks, self._marks = self._marks, {}
        if "forward_start" not in marks or "backward_comm_start" not in marks:
            return  # a backward that ddp_core's forward did not time (or nothing was sent): not counted
        self.iterations += 1
        if self.iterations > _ALWAYS_SAMPLED and self.iterations % self.sample_rate:
            return
        figures = {name: max(0, marks[end] - marks[start]) for name, (start, end) in _SPANS.items()}
        self._pending = (self.iterations, {
            **figures, **{f"{name}_start": marks[start] for name, (start, _) in _SPANS.items()
                          if name != "backward_compute_comm_overlap_time"},
            "backward_compute_time_end": marks["backward_compute_end"],
            "backward_comm_time_end": marks["backward_comm_end"],
            "prev_iteration_grad_ready_order_indices": ", ".join(map(str, ready_order))})

    def publish(self) -> None:
        """A synchronised forward starts: the latest sampled iteration's figures become visible."""
        if self._pending is None:
            return
        (self.published_iteration, self.latest), self._pending = self._pending, None
        self.published += 1
        for name in _SPANS:
            self._sums[name] += self.latest[name]

    def figures(self) -> dict[str, int | str]:
        """The latest published iteration's figures and marks, and `avg_<figure>` over the published ones."""
        if not self.published:
            return {}
        averages = {f"avg_{name}": total // self.published for name, total in self._sums.items()}
        return {**self.latest, **averages}


# Environment variables PyTorch's DDP logs (key -> variable), "N/A" when unset; per backend, as it does.
_ENVIRONMENT = {"master_port": "MASTER_PORT", "master_addr": "MASTER_ADDR",
                "torch_distributed_debug": "TORCH_DISTRIBUTED_DEBUG", "cuda_visible_devices": "CUDA_VISIBLE_DEVICES"}
_BACKEND_ENVIRONMENT = {
    "gloo": {"gloo_socket_ifname": "GLOO_SOCKET_IFNAME", "gloo_device_transport": "GLOO_DEVICE_TRANSPORT"},
    "nccl": {"nccl_socket_ifname": "NCCL_SOCKET_IFNAME", "nccl_blocking_wait": "TORCH_NCCL_BLOCKING_WAIT",
             "nccl_async_error_handling": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "nccl_debug": "NCCL_DEBUG",
             "nccl_nthreads": "NCCL_NTHREADS", "nccl_ib_timeout": "NCCL_IB_TIMEOUT"},
}
# torch dtypes under the C++ names PyTorch's DDP logs them by
_DTYPE_NAMES = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
                torch.bfloat16: "c10::BFloat16", torch.int64: "long int", torch.int32: "int"}


def _environment(backend: str, group: dist.ProcessGroup) -> dict:
    """The environment figures of PyTorch's logging data for `backend`."""
    names = {**_ENVIRONMENT, **_BACKEND_ENVIRONMENT.get(backend, {})}
    figures = {key: os.environ.get(variable, "N/A") for key, variable in names.items()}
    if backend == "gloo":
        with contextlib.suppress(Exception):  # (a private attribute of the Gloo backend's options)
            figures["gloo_num_threads"] = group._get_backend(torch.device("cpu")).options._threads
    return figures


def logging_data(reducer, ddp) -> dict:
    """PyTorch's `_get_ddp_logging_data` keys that ddp_core can fill for `ddp` and its `reducer`: settings,
    bucket layout, and the timing figures of `reducer.times` (absent until a synchronised iteration has
    finished)."""
    backend = dist.get_backend(reducer.groups[0])
    dtypes = sorted({_DTYPE_NAMES.get(p.dtype, str(p.dtype).removeprefix("torch.")) for p in reducer.params})
    return {
        "world_size": reducer.world_size,
        "rank": dist.get_rank(reducer.groups[0]),
        "module_name": type(ddp.module).__name__,
        "backend_name": backend,
        "device_ids": ", ".join(str(d.index) for d in ddp.device_ids or []),
        "output_device": -1 if ddp.output_device is None else ddp.output_device,
        "broadcast_buffers": int(ddp.forward_sync_buffers),
        "bucket_cap_bytes": int(reducer.bucket_cap_mb * 1024 * 1024),
        "find_unused_parameters": int(reducer.find_unused_parameters),
        "gradient_as_bucket_view": int(reducer.gradient_as_bucket_view),
        "static_graph": int(reducer.static_graph),
        "dtypes": ", ".join(dtypes),
        "num_parameter_tensors": len(reducer.params),
        "total_parameter_size_bytes": sum(p.numel() * p.element_size() for p in reducer.params),
        "bucket_sizes": ", ".join(str(0 if b.sparse else b.flat.numel() * b.flat.element_size())
                                  for b in reducer.buckets),
        "has_rebuilt_buckets": int(reducer.has_rebuilt_buckets),
        "num_buckets_reduced": reducer.buckets_reduced,
        **reducer.rebuilt_layout,
        "iteration": reducer.times.published_iteration,
        **reducer.times.figures(),
        **_environment(backend, reducer.groups[0]),
        **({"has_error": 1, "error": ddp.logged_error} if ddp.logged_error else {}),
        **(ddp._auto.logging_data() if getattr(ddp, "_auto", None) is not None else {}),
    }
