"""What the reducer tells: per-iteration forward, backward compute, backward communication and overlap.

The same figures, under the same names, as PyTorch's DDP logs (`_get_ddp_logging_data`), measured at
the same points: forward from the start of DDP's forward to the start of backward compute (which
begins when the wrapped module returns, so the loss counts as backward, as in PyTorch); backward
compute until the last gradient is in its bucket; communication from the first bucket's launch to the
end of synchronisation; overlap from the first launch to the end of backward compute. Times are
wall-clock nanoseconds (time.time_ns), read on the CPU: on a GPU they time the launches, not kernels.
"""
from __future__ import annotations

import time

import torch.distributed as dist

_SPANS = {  # figure -> (start mark, end mark)
    "forward_compute_time": ("forward_start", "backward_compute_start"),
    "backward_compute_time": ("backward_compute_start", "backward_compute_end"),
    "backward_comm_time": ("backward_comm_start", "backward_comm_end"),
    "backward_compute_comm_overlap_time": ("backward_comm_start", "backward_compute_end"),
}


class IterationTimes:
    """Clock marks of the running synchronised iteration, and figures of the finished ones."""

    def __init__(self):
        self._marks: dict[str, int] = {}
        self.latest: dict[str, int] = {}  # figures and marks of the latest finished iteration
        self._sums = dict.fromkeys(_SPANS, 0)
        self.iterations = 0  # finished synchronised iterations

    def mark(self, event: str) -> None:
        """Note the time of `event` in this iteration (a second mark of the same event overwrites)."""
        self._marks[event] = time.time_ns()

    def iteration_done(self) -> None:
        """Synchronisation finished: turn this iteration's marks into figures, add them to the averages."""
        marks, self._marks = self._marks, {}
        if "forward_start" not in marks or "backward_comm_start" not in marks:
            return  # a backward that ddp_core's forward did not time (or nothing was sent): not counted
        figures = {name: max(0, marks[end] - marks[start]) for name, (start, end) in _SPANS.items()}
        self.latest = {**figures, **{f"{name}_start": marks[start] for name, (start, _) in _SPANS.items()
                                     if name != "backward_compute_comm_overlap_time"},
                       "backward_compute_time_end": marks["backward_compute_end"],
                       "backward_comm_time_end": marks["backward_comm_end"]}
        self.iterations += 1
        for name, value in figures.items():
            self._sums[name] += value

    def figures(self) -> dict[str, int]:
        """The latest iteration's figures and marks, and `avg_<figure>` over all finished iterations."""
        if not self.iterations:
            return {}
        averages = {f"avg_{name}": total // self.iterations for name, total in self._sums.items()}
        return {**self.latest, **averages}


def logging_data(reducer, ddp) -> dict:
    """PyTorch's `_get_ddp_logging_data` keys that ddp_core can fill for `ddp` and its `reducer`: settings,
    bucket layout, and the timing figures of `reducer.times` (absent until a synchronised iteration has
    finished)."""
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in reducer.params})
    return {
        "world_size": reducer.world_size,
        "rank": dist.get_rank(reducer.groups[0]),
        "module_name": type(ddp.module).__name__,
        "backend_name": dist.get_backend(reducer.groups[0]),
        "device_ids": ", ".join(str(d.index) for d in ddp.device_ids or []),
        "output_device": -1 if ddp.output_device is None else ddp.output_device,
        "broadcast_buffers": int(ddp.forward_sync_buffers),
        "bucket_cap_bytes": int(reducer.bucket_cap_mb * 1024 * 1024),
        "find_unused_parameters": int(reducer.find_unused_parameters),
        "gradient_as_bucket_view": int(reducer.gradient_as_bucket_view),
        "static_graph": int(reducer.static_graph),
        "dtypes": ", ".join("float" if d == "float32" else d for d in dtypes),
        "num_parameter_tensors": len(reducer.params),
        "total_parameter_size_bytes": sum(p.numel() * p.element_size() for p in reducer.params),
        "bucket_sizes": ", ".join(str(0 if b.sparse else b.flat.numel() * b.flat.element_size())
                                  for b in reducer.buckets),
        "has_rebuilt_buckets": int(reducer.has_rebuilt_buckets),
        "num_buckets_reduced": reducer.buckets_reduced,
        "iteration": reducer.times.iterations,
        **reducer.times.figures(),
    }
