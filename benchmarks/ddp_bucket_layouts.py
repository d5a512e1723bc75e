"""Which buckets does PyTorch's DDP actually use, with and without `find_unused_parameters`?

For each atlas model (experiments/atlas/plan.py MODELS: the same specs, configurations and input sizes),
2 CPU ranks with Gloo on loopback (127.0.0.1) wrap the model in PyTorch's DistributedDataParallel with
`bucket_cap_mb` 25 (as the atlas gives it), once with `find_unused_parameters=False` and once with True,
and train `--iters` iterations (SGD with momentum, one synthetic batch from the workload's make_batch).
In the last iteration, by then past DDP's bucket rebuild, a pass-through communication hook (PyTorch's
own allreduce_hook behind a recorder) logs each bucket as the reducer launches it: its size, its
parameters and how many gradients had arrived; a post-accumulate-grad hook on every parameter logs when
each gradient arrived. Printed per model and setting: whether the buckets were rebuilt, the buckets'
sizes in MB in launch order, the bucket that holds the last gradient backward produces, what is still
to all-reduce once that gradient has arrived, and the keys `_get_ddp_logging_data()` has about buckets.

The estimate (`est`) is not a measurement: the gradients' arrival times of the default run,
replayed onto both layouts (so only the layout differs), with each bucket sent, in launch order and one
at a time, over a link of `--link-gbit` (both ranks send a bucket's bytes at once over a full-duplex
link, as a 2-rank ring all-reduce does); it says how much later communication ends with one layout than
with the other, as a ratio of forward + max(backward, communication) + optimizer. It ignores what the
link's traffic costs the 2 cores and any per-message latency, and it needs a quiet machine: its times
are the median of iterations 2 on (the layouts are the same for any `--iters` >= 2). The reference file
(about 80 s on 2 cores):

    source scripts/env.sh && nice python benchmarks/ddp_bucket_layouts.py --iters 8 \
        --ratios results/reference/x86_64-2cpu/atlas/atlas.csv \
        > results/reference/x86_64-2cpu/atlas/bucket_layouts.txt

`--models resnet18,gpt2` picks models (default: all 13). Nothing is downloaded; only loopback is used.
"""
from __future__ import annotations

import argparse
import csv
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.atlas.plan import MODELS  # noqa: E402
from experiments.measure.workloads.spec import load  # noqa: E402

WORLD_SIZE = 2
MB = 2**20


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Recorder:
    """Gradient arrivals and bucket launches of the latest iteration's backward."""

    def __init__(self, model: torch.nn.Module):
        self.names = {p.data_ptr(): n for n, p in model.named_parameters() if p.requires_grad}
        self.start = 0.0
        self.arrivals: list[tuple[str, float]] = []  # (parameter, seconds since backward started)
        self.launches: list[dict] = []
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda _p, name=name: self.arrived(name))

    def begin(self) -> None:
        """Start recording an iteration's backward."""
        self.start, self.arrivals, self.launches = time.perf_counter(), [], []

    def arrived(self, name: str) -> None:
        """A post-accumulate-grad hook: `name`'s gradient is in .grad (DDP's reducer marks it next)."""
        self.arrivals.append((name, time.perf_counter() - self.start))

    def hook(self, state, bucket):
        """DDP communication hook: log the bucket, then PyTorch's own allreduce_hook."""
        self.launches.append({"index": bucket.index(), "bytes": bucket.buffer().numel() * bucket.buffer().element_size(),
                              "params": [self.names[p.data_ptr()] for p in bucket.parameters()],
                              "arrived": len(self.arrivals)})
        return default_hooks.allreduce_hook(state, bucket)


def bucket_keys(logging_data: dict) -> dict:
    """The entries of `_get_ddp_logging_data()` that are about buckets."""
    return {k: v for k, v in sorted(logging_data.items()) if "bucket" in k}


def train(name: str, find_unused: bool, iters: int, bucket_mb: float) -> dict:
    """Train atlas model `name` `iters` iterations under PyTorch's DDP; the last iteration's buckets and
    gradient order, and the median times (forward, optimizer, each gradient's arrival) of iterations 2 on."""
    spec = MODELS[name]
    torch.manual_seed(0)
    workload = load(spec.spec, spec.model_config, spec.image_size, spec.seq_len)
    model = workload.build()
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_mb, find_unused_parameters=find_unused)
    recorder = Recorder(model)
    ddp.register_comm_hook(None, recorder.hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)
    generator = torch.Generator().manual_seed(dist.get_rank())
    batch = workload.make_batch(model, spec.batch_size, spec.image_size, spec.seq_len, generator)
    rebuilt_at, timed = None, []
    for it in range(iters):
        t0 = time.perf_counter()
        loss = workload.loss(ddp, batch)
        if rebuilt_at is None and ddp._has_rebuilt_buckets:
            rebuilt_at = it  # DDP rebuilds in forward, before this iteration's backward
        recorder.begin()
        loss.backward()
        t_backward = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if it >= 1:  # the first iteration runs on the initial buckets and warms up
            timed.append({"forward": recorder.start - t0, "optimizer": time.perf_counter() - t_backward,
                          "backward": t_backward - recorder.start, "arrivals": dict(recorder.arrivals)})
    median = statistics.median
    return {"launches": recorder.launches, "order": [p for p, _ in recorder.arrivals], "rebuilt_at": rebuilt_at,
            "forward_s": median(t["forward"] for t in timed), "optimizer_s": median(t["optimizer"] for t in timed),
            "backward_s": median(t["backward"] for t in timed),
            "arrivals": {p: median(t["arrivals"][p] for t in timed) for p in timed[0]["arrivals"]},
            "logging": bucket_keys(ddp._get_ddp_logging_data()),
            "gradient_mb": sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad) / MB,
            "tensors": sum(p.requires_grad for p in model.parameters())}


def summarise(record: dict) -> dict:
    """Bucket sizes in launch order, the bucket of the last gradient, and what is left to send after it."""
    launches = record["launches"]
    total = len(record["order"])
    last_param = record["order"][-1]
    last = next(i for i, b in enumerate(launches) if last_param in b["params"])
    tail = [b for b in launches if b["arrived"] == total]  # launched only once every gradient had arrived
    return {"sizes": [b["bytes"] / MB for b in launches], "last_param": last_param, "last_bucket": last,
            "last_bucket_mb": launches[last]["bytes"] / MB, "tail_buckets": len(tail),
            "tail_mb": sum(b["bytes"] for b in tail) / MB}


def communication_end(launches: list[dict], arrivals: dict, rate_bytes_s: float) -> float:
    """Seconds after backward starts at which the last bucket is through a link of `rate_bytes_s`: each
    bucket leaves once its gradients (at `arrivals`) and the buckets before it have, one at a time."""
    ready = free = 0.0
    for bucket in launches:
        ready = max(ready, max(arrivals[p] for p in bucket["params"]))
        free = max(free, ready) + bucket["bytes"] / rate_bytes_s
    return free


def first_ready(launches: list[dict], arrivals: dict) -> float:
    """Seconds after backward starts at which the first-launched bucket has all its gradients: when the
    link can start."""
    return max(arrivals[p] for p in launches[0]["params"])


def estimate(default: dict, unused: dict, rate_bytes_s: float) -> tuple[float, float]:
    """Estimated seconds per iteration over the link, (default, find_unused): the default run's compute and
    gradient arrival times replayed onto both layouts."""
    arrivals = default["arrivals"]
    fixed = default["forward_s"] + default["optimizer_s"]
    backward = max(arrivals.values())
    default_end, unused_end = (communication_end(r["launches"], arrivals, rate_bytes_s) for r in (default, unused))
    return fixed + max(backward, default_end), fixed + max(backward, unused_end)


def rank_main(rank: int, port: int, names: list[str], iters: int, bucket_mb: float, queue) -> None:
    """One rank: every model, without then with find_unused_parameters; rank 0 puts the records on `queue`."""
    torch.set_num_threads(1)  # one thread per rank on a 2-core machine, as the atlas runs
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    try:
        for name in names:
            records = {fu: train(name, fu, iters, bucket_mb) for fu in (False, True)}
            if rank == 0:
                queue.put((name, records))
    finally:
        dist.destroy_process_group()


def atlas_ratios(path: str | None, link: str) -> dict:
    """model -> its atlas.csv row of the find_unused cell at `link`; {} without a path."""
    if not path:
        return {}
    with open(path) as f:
        return {r["model"]: r for r in csv.DictReader(f) if r["link"] == link and r["option"] == "find_unused"}


def show(name: str, records: dict, rate_bytes_s: float) -> tuple:
    """Print one model's two layouts; return its summary row."""
    spec = MODELS[name]
    first = records[False]
    print(f"== {name}: {spec.spec} {spec.model_config or ''} image {spec.image_size} seq {spec.seq_len} batch "
          f"{spec.batch_size}; {first['tensors']} gradient tensors, {first['gradient_mb']:.1f} MB", flush=True)
    summaries = {}
    for fu, record in records.items():
        s = summaries[fu] = summarise(record)
        rebuilt = f"yes (before iteration {record['rebuilt_at'] + 1})" if record["rebuilt_at"] is not None else "no"
        print(f"  find_unused_parameters={fu}: rebuilt {rebuilt}; {len(s['sizes'])} buckets, MB in launch order: "
              f"{', '.join(f'{x:.2f}' for x in s['sizes'])}")
        print(f"    last gradient: {s['last_param']} in bucket #{s['last_bucket']} ({s['last_bucket_mb']:.2f} MB); "
              f"launched after it arrived: {s['tail_buckets']} bucket(s), {s['tail_mb']:.2f} MB; "
              f"compute forward/backward/optimizer {record['forward_s'] * 1e3:.0f}/{record['backward_s'] * 1e3:.0f}/"
              f"{record['optimizer_s'] * 1e3:.0f} ms")
        print(f"    _get_ddp_logging_data(): {record['logging']}")
    order = records[False]["order"]
    print(f"  gradient arrival order (default run): first {order[:3]}, last {order[-3:]}")
    default_s, unused_s = estimate(records[False], records[True], rate_bytes_s)
    ratio, arrivals = unused_s / default_s, records[False]["arrivals"]
    starts = [first_ready(records[fu]["launches"], arrivals) / max(arrivals.values()) for fu in (False, True)]
    print(f"  first bucket complete after {starts[0]:.0%} (default) / {starts[1]:.0%} (find_unused) of backward's "
          "gradient arrivals (default run's times)")
    print(f"  estimate over the link, layout only: default {default_s * 1e3:.0f} ms, find_unused {unused_s * 1e3:.0f} ms, "
          f"ratio {ratio:.3f}", flush=True)
    return summaries[False], summaries[True], default_s, unused_s, starts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated atlas models (default: all)")
    parser.add_argument("--iters", type=int, default=3, help="training iterations per setting (>= 2: rebuild after 1)")
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--link-gbit", type=float, default=1.0, help="the link rate of the estimate")
    parser.add_argument("--ratios", help="an atlas.csv: show its find_unused ratios at --ratios-link beside the layouts")
    parser.add_argument("--ratios-link", default="1gbit")
    args = parser.parse_args()
    names = [n.strip() for n in args.models.split(",")]
    unknown = [n for n in names if n not in MODELS]
    if unknown or args.iters < 2:
        parser.error(f"unknown models {unknown} (choose from {', '.join(MODELS)})" if unknown else "--iters must be >= 2")
    ratios, rate = atlas_ratios(args.ratios, args.ratios_link), args.link_gbit * 1e9 / 8
    print(f"# python benchmarks/ddp_bucket_layouts.py {' '.join(sys.argv[1:])}")
    print(f"# torch {torch.__version__}, Gloo, {WORLD_SIZE} ranks on 127.0.0.1, bucket_cap_mb={args.bucket_mb:g}, "
          f"{args.iters} iterations, buckets of the last one; {os.cpu_count()} CPUs", flush=True)
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    started = time.perf_counter()
    procs = mp.start_processes(rank_main, args=(free_port(), names, args.iters, args.bucket_mb, queue),
                               nprocs=WORLD_SIZE, join=False, start_method="spawn")
    rows = []
    for _ in names:
        name, records = queue.get()
        rows.append((name, *show(name, records, rate)))
    procs.join()
    print(f"\n# summary, {time.perf_counter() - started:.0f} s. atlas: find_unused/default at {args.ratios_link} [95% "
          f"interval] and both p50s in ms; est: the layout-only estimate at {args.link_gbit:g} Gbit/s, ratio and ms; per "
          "setting: when the first bucket is complete, % of backward (default/find_unused); buckets / MB of the bucket holding the last gradient / MB launched after the last gradient / "
          "sizes in MB in launch order")
    print(f"{'model':<19}{'atlas ratio [95%]':>21}{'p50 def/fu':>12}{'est':>7}{'def/fu':>10}{'start%':>8}  "
          "default (rebuilt): n / last / tail / sizes  ||  find_unused (never rebuilt): n / last / tail / sizes")
    for name, off, on, default_s, unused_s, starts in rows:
        cell = ratios.get(name)
        atlas = (f"{float(cell['ratio']):.3f} [{float(cell['ci_low']):.3f},{float(cell['ci_high']):.3f}]"
                 f"{float(cell['default_p50_ms']):>6.0f}/{float(cell['option_p50_ms']):.0f}") if cell else "-"
        sides = ["{} / {:.1f} / {:.1f} / {}".format(len(s["sizes"]), s["last_bucket_mb"], s["tail_mb"],
                                                     ",".join(f"{x:.1f}" for x in s["sizes"])) for s in (off, on)]
        print(f"{name:<19}{atlas:>33}{unused_s / default_s:>7.3f}{default_s * 1e3:>6.0f}/{unused_s * 1e3:<4.0f}"
              f"{starts[0]:>4.0%}/{starts[1]:<4.0%} "
              f"{sides[0]}  ||  {sides[1]}")


if __name__ == "__main__":
    main()
