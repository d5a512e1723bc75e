"""A torch.profiler trace of the user's own training loop, read as the profile the simulation replays.

    ddpbench predict --trace my_loop.json --allreduce results/runs/<machine> --world-size 2
    ddpbench tune-bucket --trace my_loop.json --cluster paper-v100-nccl --world-size 32

The trace is the Chrome/Kineto JSON that `torch.profiler.profile(..., record_shapes=True)` exports
(`prof.export_chrome_trace(path)`, or `tensorboard_trace_handler`) for one process running a few
iterations, with or without DDP. Per iteration (a `ProfilerStep#N` span, or else the time from one
`Optimizer.step` to the next) it finds:

- the backward passes: the autograd engine's `evaluate_function` events, one pass per `.backward()`;
  the last one is the pass DDP synchronises (earlier ones are gradient accumulation under no_sync);
- the forward of a pass: the ops whose autograd sequence numbers the pass's backward nodes carry
  (data preparation creates no autograd node, so it never counts as forward);
- every gradient's size and the moment it is ready: the `AccumulateGrad` events, with the shapes and
  dtypes that record_shapes stores, in the order they fire;
- the optimizer: `Optimizer.step#...` and `Optimizer.zero_grad#...` spans; what lies between the end
  of backward and the first optimizer step (gradient clipping, unscaling) is the tail;
- everything else in the iteration (data loading, logging, the user's own work) is `other`, a phase
  of its own that DDP neither hides nor lengthens.

On a CUDA trace the GPU's kernels set the times: a phase lasts from the first to the last kernel its
CPU ops launched (kernels are matched to launches by their correlation id), and a gradient is ready
when the last kernel launched before its AccumulateGrad returned has finished.
Each phase is the median over the iterations found.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from experiments.core.config import ConfigError
from experiments.core.profile import Profile

# The lines that make a good trace, quoted whenever a trace lacks what the model needs.
HOW_TO_RECORD = (
    "record 5 iterations like this: "
    "`with torch.profiler.profile(record_shapes=True, schedule=torch.profiler.schedule(wait=1, warmup=1, "
    "active=5)) as prof:` ... `prof.step()` at the end of every iteration of your loop ... "
    "`prof.export_chrome_trace('trace.json')` (one process; see docs/trace.md)")

BACKWARD_NODE = "autograd::engine::evaluate_function: "
ACCUMULATE = "torch::autograd::AccumulateGrad"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
ITEMSIZE = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
            "c10::complex<float>": 8, "c10::complex<double>": 16, "signed char": 1, "unsigned char": 1,
            "short int": 2, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1}
TORCH_DTYPE = {"float": "torch.float32", "double": "torch.float64", "c10::Half": "torch.float16",
               "c10::BFloat16": "torch.bfloat16"}


class TraceError(ConfigError):
    """A trace that lacks what the model needs; the message says what to record."""


@dataclass(frozen=True)
class Gradient:
    """One gradient as the trace shows it: its shape, dtype and size, in the order gradients arrive."""

    index: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int

    def describe(self) -> str:
        """`gradient #3 [64, 32] torch.float32 (8.0 kB)`."""
        return f"gradient #{self.index} {list(self.shape)} {self.dtype} ({self.nbytes / 1e3:.1f} kB)"


@dataclass
class TraceProfile:
    """What a trace gives the model: the profile, the phases it has beside it, and where it came from."""

    profile: Profile
    gradients: list[Gradient]
    other: float  # seconds per iteration of data loading and the user's own work
    accumulate: float  # seconds per iteration of earlier micro-batches' forward and backward (no_sync)
    data: float  # the part of `other` inside DataLoader spans
    steps: list[str]
    device: str
    iteration: float  # the median iteration as traced (seconds)
    warnings: list[str] = field(default_factory=list)
    gpu: str | None = None  # the traced GPU's name (deviceProperties), on a CUDA trace
    iterations: list[dict] = field(default_factory=list)  # each kept iteration's phases and ready times (raw)


@dataclass
class _Ev:
    """A complete ('X') event: name, category, thread, start and end in microseconds, args."""

    name: str
    cat: str
    pid: object
    tid: object
    ts: float
    end: float
    args: dict


def load_trace(path: Path) -> list[_Ev]:
    """The complete events of a Chrome trace file (a dict with traceEvents, or a bare list)."""
    return _load(path)[0]


def _load(path: Path) -> tuple[list[_Ev], dict]:
    """The complete events of a trace file and its top-level fields (empty for a bare list)."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ConfigError(f"--trace={str(path)!r}: {error.strerror or error}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"--trace={str(path)!r} is not JSON ({error.msg} at line {error.lineno}); "
                          "pass the file that prof.export_chrome_trace() writes") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"--trace={str(path)!r} has no traceEvents; {HOW_TO_RECORD}")
    return ([_Ev(e.get("name", ""), e.get("cat", ""), e.get("pid"), e.get("tid"), float(e["ts"]),
                 float(e["ts"]) + float(e.get("dur", 0)), e.get("args") or {})
             for e in events if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e],
            data if isinstance(data, dict) else {})


def read_trace(path: Path, name: str | None = None) -> TraceProfile:
    """Parse the trace at `path` into the profile the simulation replays; TraceError says what is missing."""
    events, top = _load(path)
    cpu = [e for e in events if e.cat in ("cpu_op", "user_annotation", "python_function")]
    if not any(e.cat == "cpu_op" for e in cpu):
        raise TraceError(f"--trace={str(path)!r} holds no CPU operators; {HOW_TO_RECORD}")
    pids = sorted({str(e.pid) for e in cpu if e.cat == "cpu_op"})
    if len(pids) > 1:
        raise TraceError(f"--trace={str(path)!r} holds {len(pids)} processes ({', '.join(pids[:4])}); the model "
                         f"needs one process's trace (rank 0's file, not a merged one); {HOW_TO_RECORD}")
    accumulates = [e for e in cpu if e.name == ACCUMULATE]
    if not accumulates:
        raise TraceError(f"--trace={str(path)!r} has no AccumulateGrad events (no backward traced, or every "
                         f"parameter frozen); {HOW_TO_RECORD}")
    if not any("Input Dims" in e.args for e in accumulates):
        raise TraceError(f"--trace={str(path)!r} has no tensor shapes, so gradient sizes are unknown "
                         f"(recorded without record_shapes=True); {HOW_TO_RECORD}")
    windows = _iterations(cpu)
    if not windows:
        raise TraceError(f"--trace={str(path)!r} has no step markers (ProfilerStep#N) and fewer than two "
                         f"Optimizer.step calls, so its iterations cannot be told apart; {HOW_TO_RECORD}")
    device = "cuda" if any(e.cat in DEVICE_CATS for e in events) else "cpu"
    gpu = _GpuTimes(events) if device == "cuda" else None
    parsed = [(label, _parse_iteration(cpu, t0, t1, gpu)) for label, t0, t1 in windows]
    parsed = [(label, it) for label, it in parsed if it is not None]
    if not parsed:
        raise TraceError(f"--trace={str(path)!r}: no traced iteration holds a whole backward pass; trace at least "
                         f"3 full iterations; {HOW_TO_RECORD}")
    # Iterations whose gradients differ from the most common layout (an evaluation step, a frozen layer
    # thawed) are left out: the model replays one layout.
    layouts = [tuple((g.shape, g.dtype) for g in it["gradients"]) for _, it in parsed]
    common = max(set(layouts), key=layouts.count)
    kept = [(label, it) for (label, it), layout in zip(parsed, layouts) if layout == common]
    warnings = []
    if len(kept) < len(parsed):
        warnings.append(f"{len(parsed) - len(kept)} traced iteration(s) with another set of gradients left out")
    if len(kept) < 3:
        warnings.append(f"only {len(kept)} whole iteration(s) traced; 5 give steadier medians")
    warnings += _comm_warnings(events, top)
    rows = [it for _, it in kept]

    def med(key):
        return statistics.median(r[key] for r in rows)

    gradients = rows[0]["gradients"]
    ready = tuple(statistics.median(col) for col in zip(*(r["ready"] for r in rows)))
    profile = Profile(
        model=name or Path(path).stem, forward=med("forward"), backward=med("backward"), ready=ready,
        tail=med("tail"), optimizer=med("optimizer"), skipped_forward=med("forward"), skipped_backward=med("backward"),
        nbytes=tuple(g.nbytes for g in gradients), dtypes=tuple(g.dtype for g in gradients),
        buffer_bytes=int(med("buffer_bytes")), hardware=_gpu_name(top) if device == "cuda" else None,
        config={"model": name or Path(path).stem, "device": device, "world_size": 1, "source": "trace",
                "trace": str(path), "steps": len(rows), "batch_size": None, "image_size": None, "seq_len": None,
                "threads": None})
    return TraceProfile(profile=profile, gradients=gradients, other=med("other"), accumulate=med("accumulate"),
                        data=med("data"), steps=[label for label, _ in kept], device=device,
                        iteration=med("iteration"), warnings=warnings, gpu=_gpu_name(top) if device == "cuda" else None,
                        iterations=[{k: v for k, v in r.items() if k != "gradients"} for r in rows])


def _gpu_name(top: dict) -> str | None:
    """The first GPU's name in the trace's deviceProperties, if it has one."""
    devices = top.get("deviceProperties") or []
    return devices[0].get("name") if devices and isinstance(devices[0], dict) else None


def _iterations(cpu: list[_Ev]) -> list[tuple[str, float, float]]:
    """(label, start, end) of each traced iteration: ProfilerStep spans, else Optimizer.step to Optimizer.step."""
    steps = sorted((e for e in cpu if e.name.startswith("ProfilerStep#")), key=lambda e: e.ts)
    if steps:
        return [(e.name, e.ts, e.end) for e in steps]
    ends = sorted(e.end for e in cpu if e.name.startswith("Optimizer.step#"))
    # With two optimizers, both steps end one iteration: keep the last end of each cluster of steps, where
    # a cluster is steps with no backward pass between them.
    backward_starts = sorted(e.ts for e in cpu if e.name.startswith(BACKWARD_NODE))
    marks = [t for i, t in enumerate(ends)
             if i + 1 == len(ends) or any(t < b < ends[i + 1] for b in backward_starts)]
    return [(f"iteration {i + 1}", a, b) for i, (a, b) in enumerate(zip(marks, marks[1:]))]


def _depth_free(events: list[_Ev]) -> list[_Ev]:
    """The events not inside another event of the list (outermost spans only)."""
    out, last_end = [], -math.inf
    for e in sorted(events, key=lambda e: (e.ts, -e.end)):
        if e.ts >= last_end:
            out.append(e)
            last_end = e.end
        else:
            last_end = max(last_end, e.end)
    return out


def _passes(nodes: list[_Ev], forward_ops: list[_Ev]) -> list[list[_Ev]]:
    """Backward nodes split into passes: a forward op starting between two nodes begins a new pass."""
    passes: list[list[_Ev]] = []
    starts = sorted(e.ts for e in forward_ops)
    for node in _depth_free(nodes):
        if passes and not any(passes[-1][-1].end <= s < node.ts for s in starts):
            passes[-1].append(node)
        else:
            passes.append([node])
    return passes


def _parse_iteration(cpu: list[_Ev], t0: float, t1: float, gpu: "_GpuTimes | None") -> dict | None:
    """One iteration's phases (seconds), gradients and ready times; None without a whole backward pass."""
    inside = [e for e in cpu if t0 <= e.ts < t1]
    nodes = [e for e in inside if e.name.startswith(BACKWARD_NODE)]
    if not nodes:
        return None
    forward_ops = [e for e in inside if e.cat == "cpu_op" and "Sequence number" in e.args
                   and not e.name.startswith(BACKWARD_NODE) and "Backward" not in e.name
                   and not any(n.ts <= e.ts < n.end for n in nodes)]
    passes = _passes(nodes, forward_ops)
    spans = []  # per pass: forward ops, backward nodes
    for index, bwd in enumerate(passes):
        seqs = {n.args.get("Sequence number") for n in bwd} - {None}
        before = bwd[0].ts
        after = passes[index - 1][-1].end if index else t0
        fwd = [e for e in forward_ops if after <= e.ts < before and e.args["Sequence number"] in seqs]
        spans.append((fwd, bwd))
    fwd, bwd = spans[-1]
    if not fwd:
        return None  # the backward of a forward traced in an earlier window
    b_start, b_end = bwd[0].ts, max(n.end for n in bwd)
    grads = sorted((e for e in inside if e.name == ACCUMULATE and b_start <= e.ts <= b_end), key=lambda e: e.ts)
    gradients = []
    for i, e in enumerate(grads):
        dims, types = e.args.get("Input Dims") or [[]], e.args.get("Input type") or [""]
        shape = tuple(int(d) for d in dims[0]) if dims and isinstance(dims[0], list) else ()
        kind = types[0] if types else ""
        gradients.append(Gradient(i, shape, TORCH_DTYPE.get(kind, kind), math.prod(shape) * ITEMSIZE.get(kind, 4)))
    optimizer_spans = [e for e in inside if e.name.startswith(("Optimizer.step#", "Optimizer.zero_grad#"))]
    later_steps = [e for e in optimizer_spans if e.name.startswith("Optimizer.step#") and e.ts >= b_end]
    tail_end = min((e.ts for e in later_steps), default=b_end)
    data = sum(e.end - e.ts for e in _depth_free([e for e in inside if e.name.startswith("enumerate(DataLoader)")]))
    buffer_bytes = sum(_batchnorm_buffer_bytes(e) for e in fwd if e.name == "aten::batch_norm")

    def clock(events, until=None):  # (start, end) of a phase: CPU times, or on a GPU its kernels' times
        if gpu is None:
            return min(e.ts for e in events), until if until is not None else max(e.end for e in events)
        return gpu.span(events)

    f = clock(fwd)
    b = clock(bwd)
    if gpu is None:
        ready = [e.end - b_start for e in grads]
        tail = tail_end - b_end
        optimizer = sum(e.end - e.ts for e in _depth_free(optimizer_spans))
    else:
        ready = [max(0.0, gpu.done_by(e.end) - b[0]) for e in grads]
        clip = [e for e in inside if e.cat == "cpu_op" and b_end <= e.ts < tail_end]
        tail = _length(gpu.span(clip)) if clip else 0.0
        optimizer = sum(_length(gpu.span([o])) for o in _depth_free(optimizer_spans))
    accumulate = sum(_length(clock(fw)) + _length(clock(bw)) for fw, bw in spans[:-1] if fw)
    iteration = t1 - t0
    forward, backward = _length(f), _length(b)
    other = max(0.0, iteration - forward - backward - tail - optimizer - accumulate)
    us = 1e-6
    return {"forward": forward * us, "backward": backward * us, "tail": tail * us, "optimizer": optimizer * us,
            "accumulate": accumulate * us, "other": other * us, "data": min(data, other) * us,
            "iteration": iteration * us, "ready": [r * us for r in ready], "gradients": gradients,
            "buffer_bytes": buffer_bytes}


def _length(span: tuple[float, float]) -> float:
    """The length of a (start, end) span, 0 where empty."""
    return max(0.0, span[1] - span[0])


def _batchnorm_buffer_bytes(op: _Ev) -> int:
    """Bytes of a batch norm's running mean and variance (the buffers DDP broadcasts each forward)."""
    dims = op.args.get("Input Dims") or []
    types = op.args.get("Input type") or []
    total = 0
    for position in (3, 4):  # aten::batch_norm(input, weight, bias, running_mean, running_var, ...)
        if position < len(dims) and isinstance(dims[position], list) and dims[position]:
            kind = types[position] if position < len(types) else "float"
            total += math.prod(dims[position]) * ITEMSIZE.get(kind, 4)
    return total


class _GpuTimes:
    """Device activity (kernels, copies) matched to the CPU launches that queued it."""

    def __init__(self, events: list[_Ev]):
        launches = {e.args.get("correlation"): e for e in events if e.cat in RUNTIME_CATS and "correlation" in e.args}
        self.work = []  # (launch time on the CPU, launching thread, device start, device end)
        for e in events:
            if e.cat in DEVICE_CATS:
                launch = launches.get(e.args.get("correlation"))
                if launch is not None:
                    self.work.append((launch.ts, launch.tid, e.ts, e.end))
        self.work.sort()

    def span(self, ops: list[_Ev]) -> tuple[float, float]:
        """First start to last end of the device work launched inside `ops` (on their threads)."""
        mine = [(s, t) for ts, tid, s, t in self.work if any(o.tid == tid and o.ts <= ts <= o.end for o in ops)]
        if not mine:
            return (0.0, 0.0)
        return min(s for s, _ in mine), max(t for _, t in mine)

    def done_by(self, cpu_time: float) -> float:
        """When the device has finished everything launched before `cpu_time` (streams run in order)."""
        return max((t for ts, _, _, t in self.work if ts <= cpu_time), default=0.0)


def _comm_warnings(events: list[_Ev], top: dict) -> list[str]:
    """A warning where the traced process all-reduced with other ranks: its backward includes their waits.
    (DDP at world size 1 all-reduces too, with itself: nothing to warn about.)"""
    ranks = (top.get("distributedInfo") or {}).get("world_size")
    comm = any(e.cat == "cpu_op" and ("all_reduce" in e.name or "allreduce" in e.name) for e in events)
    if comm and ranks != 1:
        among = f"with {ranks} ranks" if ranks else "with other ranks?"
        return [f"the trace holds all-reduces (traced under DDP {among}): its backward includes communication "
                "and waiting for the other ranks; a trace at world size 1 or without DDP gives compute alone"]
    return []


def describe(trace: TraceProfile, path: Path) -> str:
    """Which trace a prediction rests on and the phases it found (milliseconds, medians)."""
    p = trace.profile
    ms = 1e3
    total = sum(g.nbytes for g in trace.gradients) / 1e6
    first, last = trace.steps[0], trace.steps[-1]
    parts = [f"forward {p.forward * ms:.2f}", f"backward {p.backward * ms:.2f}",
             f"after backward {p.tail * ms:.2f}", f"optimizer {p.optimizer * ms:.2f}"]
    if trace.accumulate:
        parts.append(f"earlier micro-batches {trace.accumulate * ms:.2f}")
    data = f" (data loading {trace.data * ms:.2f})" if trace.data else ""
    parts.append(f"other {trace.other * ms:.2f}{data}")
    return (f"trace: {path} ({trace.device.upper()}, {len(trace.steps)} iteration(s), {first} to {last}); "
            f"{len(trace.gradients)} gradients, {total:.2f} MB; per iteration as traced {trace.iteration * ms:.2f} ms: "
            + ", ".join(parts) + " ms")


def bucket_lines(trace: TraceProfile, buckets: list[dict], groups: list[list[int]]) -> list[str]:
    """One line per bucket: its size, its gradients and the gradient it waits for (the last to be ready)."""
    lines, ready = [], trace.profile.ready
    for i, (bucket, members) in enumerate(zip(buckets, groups)):
        last = trace.gradients[max(members, key=ready.__getitem__)]
        timing = f", starts {bucket['start'] * 1e3:.2f} ms, done {bucket['done'] * 1e3:.2f} ms" if "start" in bucket else ""
        lines.append(f"  bucket {i}: {bucket['bytes'] / 1e6:.2f} MB, {len(members)} gradient(s), waits for "
                     f"{last.describe()}, ready {bucket['ready'] * 1e3:.2f} ms into backward{timing}")
    return lines


def trace_summary(trace: TraceProfile, comm, plans: list, recommended: float | None) -> dict:
    """The trace's phases and, per distinct schedule shown (tune-bucket: the recommended cap), each bucket
    and the gradient it waits for."""
    from experiments.perfmodel.simulate import buckets_of, simulate

    shown = [s for s in plans if recommended is None or s.bucket_mb == recommended][:4]  # a few, not a wall of text
    buckets = []
    for plan in shown:
        prediction = simulate(trace.profile, comm, plan)
        groups = buckets_of(trace.profile, plan.bucket_mb, plan.first_bucket_mb)
        buckets.append({"world_size": plan.world_size, "bucket_mb": plan.bucket_mb, "overlap": plan.overlap,
                        "lines": bucket_lines(trace, prediction.buckets, groups),
                        "waits_for": [max(g, key=trace.profile.ready.__getitem__) for g in groups]})
    return {"steps": trace.steps, "device": trace.device, "iteration_ms": trace.iteration * 1e3,
            "other_ms": trace.other * 1e3, "data_ms": trace.data * 1e3, "accumulate_ms": trace.accumulate * 1e3,
            "gradients": [{"shape": list(g.shape), "dtype": g.dtype, "bytes": g.nbytes} for g in trace.gradients],
            "warnings": trace.warnings, "buckets": buckets}
