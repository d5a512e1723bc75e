"""Convergence under skipped synchronisation (the paper's E6): training loss per iteration for sync-every n.

The task has a known solution: a fixed random "teacher" network labels random inputs, and a student of
the same shape learns to imitate it, so the loss can fall towards zero. Every iteration each rank draws
a fresh batch; with sync-every n, n-1 backward passes run inside no_sync() and the n-th reduces the
accumulated gradients, after which the optimizer steps (stepping without a reduction would let the
replicas drift apart): n iterations make one step on an n times larger batch. The loss is recorded
per iteration, averaged over the ranks.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from experiments.args import add_network_arguments, check_positive, items, parse_network_arguments
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
    from torch import nn

IN_FEATURES, HIDDEN, CLASSES = 32, 64, 10


@dataclass(frozen=True)
class TrainConfig:
    """One training run of the convergence experiment."""

    sync_every: int
    backend: str
    device: str
    world_size: int
    batch_size: int
    iters: int
    lr: float
    seed: int
    threads: int
    link: str = "none"
    ranks_per_host: int = 1


@dataclass(frozen=True)
class TrainOptions:
    """What `ddpbench train` trains and where its records go (its flags, typed). A list option takes its
    comma-separated text or the values themselves; backend and device None: the hardware's."""

    out: Path
    sync_every: str | list[int] = "1,2,4,8"
    backend: str | list[str] | None = None
    device: str | None = None
    world_size: str | list[int] = "2"
    batch_size: int = 16
    iters: int = 400
    lr: float = 0.05
    seed: int = 0
    threads: int = 1
    link: str | list[str] = "none"
    ranks_per_host: str | list[int] = "1"
    resume: bool = False
    timeout: float = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `train` sub-command's options."""
    parser.add_argument("--sync-every", default="1,2,4,8",
                        help="comma-separated n: reduce every n iterations (default 1,2,4,8)")
    parser.add_argument("--backend", help=f"comma-separated of {', '.join(BACKENDS)}; default nccl with GPUs, "
                        "else gloo")
    parser.add_argument("--device", help=f"one of {', '.join(DEVICES)}; default cuda with GPUs, else cpu")
    parser.add_argument("--world-size", default="2", help="comma-separated rank counts (default 2)")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per rank and iteration (default 16)")
    parser.add_argument("--iters", type=int, default=400, help="training iterations, all recorded (default 400)")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate, momentum 0.9 (default 0.05)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the student's weights and the data (default 0)")
    parser.add_argument("--threads", type=int, default=1, help="compute threads per rank (default 1)")
    add_network_arguments(parser)


def main(options: TrainOptions) -> int:
    """`ddpbench train`: train every run not yet recorded in --out (see command.measure_jobs)."""
    from experiments.measure.command import measure_jobs

    return measure_jobs("train", options.out, options.resume, options.timeout, lambda: resolve(options),
                        lambda runs: run(runs, options))


def resolve(options: TrainOptions) -> list[TrainConfig]:
    """Validated training runs, one per (backend, world size, sync-every)."""
    default_backend, default_device = default_backend_and_device()
    backends = items(options.backend or default_backend)
    device = options.device or default_device
    for name, value in (("batch-size", options.batch_size), ("iters", options.iters), ("threads", options.threads)):
        if value < 1:
            raise ConfigError(f"--{name}={value} is not allowed; it must be >= 1")
    check_positive("lr", options.lr)
    runs = []
    for backend, world_size, n, (link, ranks_per_host) in itertools.product(
        backends, parse_ints("world-size", options.world_size, 1), parse_ints("sync-every", options.sync_every, 1),
        parse_network_arguments(options.link, options.ranks_per_host),
    ):
        validate_backend(backend, device, world_size)
        validate_network(link, ranks_per_host, world_size)
        runs.append(TrainConfig(n, backend, device, world_size, options.batch_size, options.iters, options.lr,
                                options.seed, options.threads, link, ranks_per_host))
    return runs


def mlp() -> nn.Module:
    """The architecture of teacher and student."""
    from torch import nn

    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, CLASSES))


def train(rank: int, world_size: int, fields: dict) -> dict:
    """On one rank: train the student; return the rank-averaged loss per iteration and held-out accuracy."""
    # torch is imported here, in the ranks: the command line imports this module only to parse its options.
    import torch
    import torch.distributed as dist
    from torch import nn

    from ddp_core import DistributedDataParallel
    from experiments.measure.harness import rank_device

    config = TrainConfig(**fields)
    device = rank_device(rank, config.device)
    torch.manual_seed(12345)  # the teacher is the same for every config: the task must not change with n
    teacher = mlp().to(device)
    torch.manual_seed(config.seed)
    student = DistributedDataParallel(mlp().to(device), device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(student.parameters(), lr=config.lr, momentum=0.9)
    generator = torch.Generator().manual_seed(config.seed * 7919 + rank)

    def batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(size, IN_FEATURES, generator=generator).to(device)
        with torch.no_grad():
            return x, teacher(x).argmax(dim=1)

    losses = []
    for i in range(config.iters):
        x, y = batch(config.batch_size)
        sync = (i + 1) % config.sync_every == 0
        with contextlib.nullcontext() if sync else student.no_sync():
            loss = nn.functional.cross_entropy(student(x), y)
            # Gradients of the n iterations add up, so one step after n iterations moves about as far as
            # n steps would (the linear-scaling rule for an n times larger batch).
            loss.backward()
        if sync:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    mean_losses = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(mean_losses)
    x, y = batch(2048)
    with torch.no_grad():
        accuracy = (student.module(x).argmax(dim=1) == y).double().mean().item()
    return {"loss": (mean_losses / world_size).tolist(), "accuracy": accuracy}


def make_record(config: TrainConfig, per_rank: list[dict], wall_s: float) -> dict:
    """The run's record: loss per iteration and the mean held-out accuracy over the ranks."""
    losses = per_rank[0]["loss"]
    tail = losses[-max(1, len(losses) // 10):]
    return {
        "kind": "train", "status": "ok", "config": dataclasses.asdict(config),
        "loss": losses,
        "summary": {"p50": statistics.median(tail), "final_loss_mean": statistics.fmean(tail),
                    "accuracy": statistics.fmean(r["accuracy"] for r in per_rank)},
        "timing": {"config_wall_s": wall_s},
    }


def run(runs: list[TrainConfig], options: TrainOptions) -> dict:
    """Train every run not yet recorded (see sweep.run_jobs)."""
    from experiments.measure.sweep import run_jobs

    return run_jobs(runs, options.out, train, make_record, "train", resume=options.resume, timeout=options.timeout)
