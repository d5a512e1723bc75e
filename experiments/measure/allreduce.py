"""All-reduce microbenchmarks: the paper's E1 and an nccl-tests-style size sweep.

- granularity (E1): a fixed total (60 M float32 by default) reduced in calls of `per_call` elements,
  all launched asynchronously, then waited for: total time per granularity.
- size: one all-reduce of each size; time, algbw = bytes / time, busbw = algbw * 2(n-1)/n (comparable
  across rank counts), and a checked result, as nccl-tests' `#wrong`.
Each rank fills its tensor with rank + 1, so every element must come back as n(n+1)/2.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from experiments.args import add_network_arguments, items, parse_network_arguments
from experiments.core.config import (
    BACKENDS,
    DEVICES,
    ConfigError,
    default_backend_and_device,
    parse_ints,
    validate_backend,
    validate_network,
)

if TYPE_CHECKING:
    import torch

MODES = ("granularity", "size")
DEFAULT_PER_CALL = "1000,10000,100000,1000000,10000000,60000000"
DEFAULT_SIZES = ",".join(str(4 ** k * 1024) for k in range(0, 10))  # 1 KiB .. 256 MiB


@dataclass(frozen=True)
class AllreduceConfig:
    """One row: a granularity (elements per call) of E1, or one message size of the sweep."""

    mode: str
    backend: str
    device: str
    world_size: int
    elements: int  # granularity: elements per call; size: elements in the one tensor
    total_elements: int  # granularity: elements reduced in all; size: equal to `elements`
    reps: int
    warmup: int
    threads: int
    link: str = "none"
    ranks_per_host: int = 1


@dataclass(frozen=True)
class AllreduceOptions:
    """What `ddpbench allreduce` measures and where its records go (its flags, typed). A list option takes
    its comma-separated text or the values themselves; backend and device None: the hardware's."""

    out: Path
    mode: str | list[str] = "granularity,size"
    backend: str | list[str] | None = None
    device: str | None = None
    world_size: str | list[int] = "2"
    total: int = 60_000_000
    per_call: str | list[int] = DEFAULT_PER_CALL
    sizes: str | list[int] = DEFAULT_SIZES
    reps: int = 5
    warmup: int = 2
    threads: int = 1
    link: str | list[str] = "none"
    ranks_per_host: str | list[int] = "1"
    resume: bool = False
    timeout: float = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `allreduce` sub-command's options."""
    parser.add_argument("--mode", default="granularity,size",
                        help="comma-separated of granularity (E1), size (sweep); default both")
    parser.add_argument("--backend",
                        help=f"comma-separated of {', '.join(BACKENDS)}; default nccl with GPUs, else gloo")
    parser.add_argument("--device", help=f"one of {', '.join(DEVICES)}; default cuda with GPUs, else cpu")
    parser.add_argument("--world-size", default="2", help="comma-separated rank counts (default 2)")
    parser.add_argument("--total", type=int, default=60_000_000,
                        help="float32 elements in all, for E1 (default 60000000)")
    parser.add_argument("--per-call", default=DEFAULT_PER_CALL,
                        help=f"comma-separated elements per all-reduce call, for E1 (default {DEFAULT_PER_CALL})")
    parser.add_argument("--sizes", default=DEFAULT_SIZES,
                        help="comma-separated message sizes in bytes, for the sweep (default 1 KiB to 256 MiB, x4)")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per row (default 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed repetitions before the timed ones (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="compute threads per rank (default 1)")
    add_network_arguments(parser)


def main(options: AllreduceOptions) -> int:
    """`ddpbench allreduce`: measure every row not yet recorded in --out (see command.measure_jobs)."""
    from experiments.measure.command import measure_jobs

    return measure_jobs("allreduce", options.out, options.resume, options.timeout, lambda: resolve(options),
                        lambda rows: run(rows, options))


def resolve(options: AllreduceOptions) -> list[AllreduceConfig]:
    """Validated rows, grouped so that rows sharing ranks run in one pool."""
    modes = items(options.mode)
    for mode in modes:
        if mode not in MODES:
            raise ConfigError(f"--mode={mode!r} is not allowed; choose from {', '.join(MODES)}")
    default_backend, default_device = default_backend_and_device()
    backends = items(options.backend or default_backend)
    device = options.device or default_device
    world_sizes = parse_ints("world-size", options.world_size, minimum=1)
    for name, value, minimum in (("total", options.total, 1), ("reps", options.reps, 1), ("warmup", options.warmup, 0),
                                 ("threads", options.threads, 1)):
        if value < minimum:
            raise ConfigError(f"--{name}={value} is not allowed; it must be >= {minimum}")
    rows = []
    networks = parse_network_arguments(options.link, options.ranks_per_host)
    for backend, world_size, (link, ranks_per_host) in itertools.product(backends, world_sizes, networks):
        validate_backend(backend, device, world_size)
        validate_network(link, ranks_per_host, world_size)
        common = dict(backend=backend, device=device, world_size=world_size, reps=options.reps, warmup=options.warmup,
                      threads=options.threads, link=link, ranks_per_host=ranks_per_host)
        if "granularity" in modes:
            for per_call in parse_ints("per-call", options.per_call, minimum=1):
                rows.append(AllreduceConfig("granularity", elements=min(per_call, options.total),
                                            total_elements=options.total, **common))
        if "size" in modes:
            for size in parse_ints("sizes", options.sizes, minimum=4):
                rows.append(AllreduceConfig("size", elements=size // 4, total_elements=size // 4, **common))
    return list(dict.fromkeys(rows))


def measure(rank: int, world_size: int, fields: dict) -> dict:
    """On one rank: time `reps` repetitions of the row; count wrong elements afterwards."""
    # torch is imported here, in the ranks: the command line imports this module only to parse its options.
    import torch
    import torch.distributed as dist

    from experiments.measure.harness import rank_device

    row = AllreduceConfig(**fields)
    device = rank_device(rank, row.device)
    flat = torch.empty(row.total_elements, dtype=torch.float32, device=device)
    chunks = flat.split(row.elements)
    times = []
    for rep in range(row.warmup + row.reps):
        flat.fill_(rank + 1)
        _synchronize(device)
        dist.barrier()  # all ranks start together: a late rank's delay is not the collective's cost
        start = time.perf_counter()
        works = [dist.all_reduce(chunk, async_op=True) for chunk in chunks]
        for work in works:
            work.wait()
        _synchronize(device)  # the clock is read only once the device has finished
        if rep >= row.warmup:
            times.append(time.perf_counter() - start)
    expected = world_size * (world_size + 1) / 2
    wrong = int((flat != expected).sum().item())
    return {"times": times, "wrong": wrong}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def make_record(row: AllreduceConfig, per_rank: list[dict], wall_s: float) -> dict:
    """The row's record: the slowest rank per repetition, bandwidths at the median, the wrong count."""
    times = [max(ts) for ts in zip(*(r["times"] for r in per_rank))]
    median = statistics.median(times)
    nbytes = row.total_elements * 4
    algbw = nbytes / median
    return {
        "kind": "allreduce", "status": "ok", "config": dataclasses.asdict(row),
        "latency_s": times,
        "summary": {"p50": median, "min": min(times), "max": max(times), "n": len(times),
                    "calls": -(-row.total_elements // row.elements), "bytes": nbytes,
                    "algbw_GBps": algbw / 1e9, "busbw_GBps": algbw * 2 * (row.world_size - 1) / row.world_size / 1e9},
        "wrong": sum(r["wrong"] for r in per_rank),
        "correct": all(r["wrong"] == 0 for r in per_rank),
        "timing": {"config_wall_s": wall_s},
    }


def run(rows: list[AllreduceConfig], options: AllreduceOptions) -> dict:
    """Measure every row not yet recorded (see sweep.run_jobs)."""
    from experiments.measure.sweep import run_jobs

    return run_jobs(rows, options.out, measure, make_record, "allreduce", resume=options.resume,
                    timeout=options.timeout)
