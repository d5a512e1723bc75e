"""The measured training loop that runs on every rank, for one config.

The step reads top to bottom in `measure`: forward, backward (with the all-reduces it overlaps),
waiting for communication, optimizer. Phase boundaries come from a `Clock` that synchronises the device
before reading it (CUDA events on GPUs), and from ddp_core's reducer observer, which marks the moment
autograd finished computing gradients so that waiting for the all-reduce can be told apart.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import time
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import ddp_core
from experiments.core.config import AUTO_CAP, RunConfig
from experiments.core.machine import busy_cpu_seconds, host_key
from experiments.core.profile import load_compute_profile
from experiments.emulate import compute as emulated
from experiments.measure import progress
from experiments.measure.amp import FULL, Precision
from experiments.measure.memory import PeakMemory
from experiments.measure.workloads.base import Workload, model_size
from experiments.measure.workloads.spec import load as load_workload

# --comm-hook NAME for --impl torch: PyTorch's hook of the same algorithm as ddp_core.hooks.HOOKS[NAME].
TORCH_DEFAULT_HOOKS = {"allreduce": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook,
                       "bf16": default_hooks.bf16_compress_hook}


def in_bucket_order(hook):
    """`hook`, with each bucket's communication started only once the previous bucket's has completed.

    Why: PowerSGD's hook issues its second all-reduce (of Q) from a completion callback, on a thread of
    the process group, while autograd's thread goes on issuing the next buckets' all-reduces. Which comes
    first differs between ranks, and Gloo matches collectives by the order they are issued: with more
    than one bucket, ranks exchange a P for a Q and fail ("Received data size doesn't match expected
    size") or hang. In bucket order, every rank issues the same collectives in the same order; the
    backward computation still overlaps with communication, one bucket's at a time.
    """
    previous = None

    @functools.wraps(hook)  # the name PyTorch's DDP logs, and `observe` reads, stays the hook's own
    def ordered(state, bucket) -> torch.futures.Future[torch.Tensor]:
        nonlocal previous
        result = torch.futures.Future()

        def settle(done) -> None:
            try:
                result.set_result(done.value())
            except Exception as error:  # noqa: BLE001 - the failure is the reducer's to raise
                result.set_exception(error)

        def start(_=None) -> None:
            try:
                hook(state, bucket).then(settle)
            except Exception as error:  # noqa: BLE001
                result.set_exception(error)

        if bucket.index() == 0 or previous is None:  # the first bucket of an iteration starts at once
            start()
        else:
            previous.then(start)
        previous = result
        return result

    return ordered


class Clock:
    """Timestamps within one iteration; on CUDA, events read only after a device synchronisation."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: dict[str, object] = {}

    def mark(self, name: str) -> None:
        """Remember now under `name` (on CUDA: an event on the current stream)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks[name] = event
        else:
            self.marks[name] = time.perf_counter()

    def start(self) -> None:
        """Begin an iteration: the device is idle, so nothing earlier leaks into it."""
        if self.cuda:
            torch.cuda.synchronize()  # a sync point, outside the measured interval
        self.marks = {}
        self.mark("start")

    def seconds(self) -> dict[str, float]:
        """Seconds from the start to each mark (synchronises the device first)."""
        if self.cuda:
            torch.cuda.synchronize()
            start = self.marks["start"]
            return {k: start.elapsed_time(e) / 1000 for k, e in self.marks.items()}
        return {k: t - self.marks["start"] for k, t in self.marks.items()}


class BucketTimes:
    """ddp_core reducer observer: marks the end of backward compute and each bucket's launch and completion."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self.buckets: dict[int, list[float]] = {}

    def parameter_ready(self, index: int) -> None:
        """Not needed per iteration here (see perfmodel.profile)."""

    def bucket_launched(self, index: int, future: torch.futures.Future) -> None:
        """Record the launch time and, when the all-reduce completes, its completion time."""
        self.buckets[index] = [time.perf_counter(), None]
        future.then(lambda _: self.buckets[index].__setitem__(1, time.perf_counter()))

    def backward_computed(self) -> None:
        """Mark the moment autograd finished computing gradients."""
        self.clock.mark("backward_computed")

    def gradients_synchronised(self) -> None:
        """Nothing to mark: backward() returns right after this."""


def rank_device(rank: int, device_type: str) -> torch.device:
    """This rank's device: the CPU, or its local GPU (LOCAL_RANK under torchrun), made current."""
    if device_type != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def wrap(model: torch.nn.Module, config: RunConfig, device: torch.device, group=None,
         ddp_module: ModuleType = ddp_core) -> torch.nn.Module:
    """Wrap `model` in the DDP implementation the config names (over `group`, default: all ranks), with
    the config's DDP options, communication hook and torch.compile mode; `ddp_module`: which copy of the
    ddp_core package (an interleaved A/B loads one per revision)."""
    device_ids = [device] if device.type == "cuda" else None
    options = {"find_unused_parameters": config.find_unused_parameters, "static_graph": config.static_graph,
               "gradient_as_bucket_view": config.bucket_view}
    if config.impl == "torch":
        ddp = TorchDDP(model, device_ids=device_ids, process_group=group, bucket_cap_mb=config.bucket_mb, **options)
    else:
        groups = ddp_module.new_round_robin_groups(config.process_groups) if config.process_groups > 1 else group
        ddp = ddp_module.DistributedDataParallel(model, device_ids=device_ids, process_group=groups,
                                               bucket_cap_mb=config.bucket_mb, overlap=config.impl == "ddp_core",
                                               **options)
    if config.comm_hook == "powersgd":
        # PyTorch's PowerSGD, from the third iteration on (the first ones run plain all-reduce; the warm-up
        # covers them), so that measured iterations compress.
        state = powerSGD.PowerSGDState(process_group=group, matrix_approximation_rank=config.powersgd_rank,
                                       start_powerSGD_iter=2)
        ddp.register_comm_hook(state, in_bucket_order(powerSGD.powerSGD_hook))
    elif config.comm_hook != "none" and config.impl == "torch":
        # PyTorch's DDP gets PyTorch's own hooks: it refuses ddp_core's (their return annotation is not
        # the Future[Tensor] it checks for), and its users would register these.
        ddp.register_comm_hook(group, TORCH_DEFAULT_HOOKS[config.comm_hook])
    elif config.comm_hook != "none":
        ddp.register_comm_hook(None, ddp_module.hooks.HOOKS[config.comm_hook])
    if config.compile != "none":
        # The wrapped model is compiled, as PyTorch's docs advise for DDP (attributes such as `reducer`
        # still reach the DDP module through the compiled wrapper). Compiling happens in the warm-up.
        ddp = torch.compile(ddp, mode=None if config.compile == "default" else config.compile)
    return ddp


def parameter_digest(model: torch.nn.Module) -> str:
    """A hash of every parameter's bytes: equal on all ranks exactly when the replicas are equal."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def train_step(ddp, family, batch: dict, optimizer, sync: bool, mark=lambda phase: None,
               precision: Precision = FULL) -> None:
    """One iteration: forward, backward (with the all-reduces), optimizer; `mark(phase)` at each phase end."""
    with contextlib.nullcontext() if sync else ddp.no_sync():
        with precision.autocast():  # --amp: forward in bf16/fp16 where autocast allows
            loss = family.loss(ddp, batch)
        mark("forward")
        precision.backward(loss)  # with ddp_core: compute, then the wait for all-reduce at its end
        mark("backward")
    if sync:
        precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
    mark("optimizer")


@dataclass
class Trainee:
    """What one rank trains for a config: the model, its DDP wrapper, optimizer and a fixed batch."""

    device: torch.device
    family: Workload | ModuleType  # (emulated compute: the stand-in module)
    model: torch.nn.Module
    ddp: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batch: dict
    precision: Precision = FULL
    compute: dict | None = None  # emulated compute: which profile the stand-in replays


def build(rank: int, config: RunConfig, group=None, ddp_module: ModuleType = ddp_core) -> Trainee:
    """Build this rank's model, wrapper (over `group`, default: all ranks; from `ddp_module`, see wrap),
    optimizer and synthetic batch (the same batch every iteration, so that making data never counts as
    training time)."""
    device = rank_device(rank, config.device)
    torch.manual_seed(config.seed)
    family = load_workload(config.model, config.model_config, config.image_size, config.seq_len,
                           config.model_hash)
    builder = family.build
    if config.compute == "emulated":  # a stand-in with the model's parameters that waits for the profiled times
        compute = load_compute_profile(config.compute_profile, config.model, config.world_size)
        family, model = emulated, emulated.build_stand_in(builder, compute, config.time_dilation, device)
        ddp = model.wrapper = wrap(model, config, device, group, ddp_module)
        optimizer = emulated.StandInOptimizer(compute.profile, config.time_dilation)
    else:
        model = builder().to(device)
        ddp = wrap(model, config, device, group, ddp_module)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)
    generator = torch.Generator().manual_seed(config.seed * 1000 + rank)
    batch = {k: v.to(device) for k, v in
             family.make_batch(model, config.batch_size, config.image_size, config.seq_len, generator).items()}
    return Trainee(device, family, model, ddp, optimizer, batch, precision=Precision(config.amp, device),
                   compute=compute.source if config.compute == "emulated" else None)


def fill_exposed_comm_from_torch(iteration: dict, logging_data: dict) -> None:
    """Split PyTorch's DDP's wait for communication out of an iteration's "backward" phase.

    PyTorch's reducer times each synchronised iteration's backward compute and bucket all-reduces
    itself and publishes them at the next synchronised forward (`_get_ddp_logging_data`; sampled every
    iteration once `_set_ddp_runtime_logging_sample_rate(1)`). What communication ran on after the last
    gradient was computed is the exposed part: it leaves "backward" (timed by our clock up to the end of
    the wait) and becomes "exposed_comm", as ddp_core's observer splits it. The run's last synchronised
    iteration has no next one: its wait stays inside "backward" and its "exposed_comm" None."""
    comm_end, compute_end = logging_data.get("backward_comm_time_end"), logging_data.get("backward_compute_time_end")
    if not comm_end or not compute_end:
        return
    phases = iteration["phases"]
    exposed = min(max(0.0, (comm_end - compute_end) / 1e9), phases["backward"])
    phases["backward"] -= exposed
    phases["exposed_comm"] = exposed


def slowest_per_iteration(local: list[float]) -> list[float]:
    """Gather every rank's per-iteration seconds; an iteration takes as long as its slowest rank."""
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return [max(per_rank) for per_rank in zip(*gathered)]


def tune_bucket_cap(t: Trainee, ddp: ddp_core.DistributedDataParallel, clock: Clock) -> dict:
    """bucket_cap_mb="auto": train synchronised iterations until ddp_core has chosen its cap (at most its
    budget), timing each one; they are counted apart from the config's warm-up and measured iterations,
    which then all run on the chosen buckets. Returns their seconds and what ddp_core says it chose, and why."""
    def state() -> str:
        return ddp.get_ddp_logging_data()["auto_bucket_state"]

    seconds = []
    while state() in ddp_core.auto_bucket.TUNING_STATES and len(seconds) < ddp_core.auto_bucket.BUDGET:
        clock.start()
        train_step(t.ddp, t.family, t.batch, t.optimizer, True, clock.mark, t.precision)
        seconds.append(clock.seconds()["optimizer"])
        progress.report("choosing the bucket cap", len(seconds), ddp_core.auto_bucket.BUDGET)
    figures = {k: v for k, v in ddp.get_ddp_logging_data().items() if k.startswith("auto_")}
    return {"iterations_s": seconds, **figures}


def measure(rank: int, world_size: int, config_fields: dict) -> dict:
    """Run one config on this rank: warm-up, then measured iterations; returns raw per-iteration times."""
    config = RunConfig(**config_fields)
    setup_start = time.perf_counter()
    t = build(rank, config)
    device, ddp = t.device, t.ddp
    clock = Clock(device)
    inner = getattr(ddp, "_orig_mod", ddp)  # under torch.compile, the DDP module it wraps
    observer = BucketTimes(clock) if isinstance(inner, ddp_core.DistributedDataParallel) else None
    if observer is not None:
        inner.reducer.observer = observer
    torch_logging = isinstance(inner, TorchDDP)
    if torch_logging:  # record PyTorch's runtime stats every iteration (by default: 1-10, then every 100th)
        inner._set_ddp_runtime_logging_sample_rate(1)
    setup_s = time.perf_counter() - setup_start
    # --bucket-mb auto: ddp_core chooses its cap in iterations of their own, before warm-up and measuring
    auto_bucket = tune_bucket_cap(t, inner, clock) if config.bucket_mb == AUTO_CAP else None
    memory = PeakMemory(device)

    iterations, timeline, warmup_s = [], None, 0.0
    awaiting_stats = None  # PyTorch's DDP: the last synchronised iteration, whose stats come with the next one
    for i in range(config.warmup + config.iters):
        measured = i - config.warmup
        # Skip-sync (E5): reduce every n-th iteration, accumulate locally in between. Warm-up syncs always.
        sync = measured < 0 or (measured + 1) % config.sync_every == 0
        if observer is not None:
            observer.buckets = {}
        if measured == 0:
            memory.reset()  # the peak of the measured iterations: a pool's rank ran other configs before
            cpu_start, own_start, measuring_start = busy_cpu_seconds(), time.process_time(), time.perf_counter()
        wall_start = time.perf_counter()
        clock.start()
        try:
            train_step(ddp, t.family, t.batch, t.optimizer, sync, clock.mark, t.precision)
        except RuntimeError as error:
            if "find_unused_parameters" in str(error) and not config.find_unused_parameters:
                # Both DDPs advise a keyword; in ddpbench it is an option of `run`.
                raise RuntimeError(f"{error} [ddpbench: some parameters get no gradient; measure with "
                                   "--find-unused-parameters true]") from error
            raise
        marks = clock.seconds()
        if torch_logging and sync:  # a synchronised forward published the previous synchronised iteration's stats
            if awaiting_stats is not None:
                fill_exposed_comm_from_torch(awaiting_stats, inner._get_ddp_logging_data())
            awaiting_stats = None
        if measured < 0:
            warmup_s += marks["optimizer"]
            progress.report("warm-up", i + 1, config.warmup)
            continue
        progress.report("measured", measured + 1, config.iters)
        computed = marks.get("backward_computed", marks["backward"]) if sync else marks["backward"]
        phases = {
            "forward": marks["forward"],
            "backward": computed - marks["forward"],
            # PyTorch's DDP: its C++ reducer's wait is split out of "backward" one synchronised iteration
            # later, from its logging data (fill_exposed_comm_from_torch)
            "exposed_comm": marks["backward"] - computed if observer is not None else (None if sync else 0.0),
            "optimizer": marks["optimizer"] - marks["backward"],
        }
        iterations.append({"latency": marks["optimizer"], "phases": phases})
        if torch_logging and sync:
            awaiting_stats = iterations[-1]
        if observer is not None and observer.buckets:
            timeline = {"wall_start": wall_start, "marks": marks,
                        "buckets": {k: [None if t is None else t - wall_start for t in v]
                                    for k, v in sorted(observer.buckets.items())}}
    if device.type == "cuda":
        torch.cuda.synchronize()
    cpu_end, own_end, measuring_s = busy_cpu_seconds(), time.process_time(), time.perf_counter() - measuring_start
    cores_busy = None if None in (cpu_start, cpu_end) else (cpu_end - cpu_start) / sum(i["latency"] for i in iterations)
    # What this rank's process (all its threads) used meanwhile, and the machine: the sweep subtracts the
    # ranks of this host from the machine's busy time to find what other processes kept busy.
    load = {"host": host_key(), "own_cpu_s": own_end - own_start, "measuring_s": measuring_s,
            "machine_busy_s": None if None in (cpu_start, cpu_end) else cpu_end - cpu_start}
    return {"rank": rank, "setup_s": setup_s, "warmup_s": warmup_s, "iterations": iterations, "cores_busy": cores_busy,
            "load": load,
            "compute": t.compute,
            "memory": memory.read(), "auto_bucket": auto_bucket,
            "digest": parameter_digest(t.model), "timeline": timeline, "model_size": model_size(t.model)}
