"""What each rank runs for one block of the atlas: one replica of the model per variant, interleaved.

Why interleaved: on a shared machine one set of processes runs 10-30% faster or slower than the next,
and its speed drifts within seconds (see regression/interleaved.py, which A/Bs two revisions the same
way). A variant measured in its own run would carry that drift into its ratio to the default. Here
every variant's replica lives in the same processes, and in each round every variant runs one iteration,
in an order shuffled anew per round (the same order on every rank, so that collectives match): drift
hits all variants alike, and the rounds pair each variant's iteration with the default's of that round.

Every replica is built with the same seed and trains on the same batch (harness.build seeds both from
the config), wrapped in PyTorch's DDP with its variant's options (harness.wrap, as `run --impl torch`
wraps it). After the rounds, each replica's DDP is asked what it was given (`observe`): the atlas
tabulates no variant whose DDP did not run with its options.
"""
from __future__ import annotations

import random
import time
import warnings

from experiments.core.config import AUTO_CAP, RunConfig


def observe(ddp) -> dict:
    """The options a DDP module (or its torch.compile wrapper) runs with, as it reports them itself (its
    logging data: what the C++ reducer, or ddp_core's, was told), its communication hook with that hook's
    state, and under bucket_cap_mb="auto" what ddp_core chose and why (`auto_bucket`, not an option)."""
    import ddp_core

    inner = getattr(ddp, "_orig_mod", ddp)  # under torch.compile, the DDP module it wraps
    data = inner._get_ddp_logging_data()
    hooks = getattr(inner, "_comm_hooks", [])
    state = hooks[0][1] if hooks else None
    auto = {k: v for k, v in data.items() if k.startswith("auto_")} if data.get("bucket_cap_auto") else None
    return {"impl": "ddp_core" if isinstance(inner, ddp_core.DistributedDataParallel) else "torch",
            "find_unused_parameters": bool(data.get("find_unused_parameters")),
            "static_graph": bool(data.get("static_graph")),
            "gradient_as_bucket_view": bool(data.get("gradient_as_bucket_view")),
            "bucket_cap_mb": "auto" if auto is not None else data["bucket_cap_bytes"] / 2**20,
            "comm_hook": hooks[0][0].__name__ if hooks else "none",
            "powersgd_rank": getattr(state, "matrix_approximation_rank", None),
            # PowerSGD counts the iterations it ran (its state's `iter`): proof that the hook ran, not only
            # that it was registered
            "hook_iterations": getattr(state, "iter", None),
            "compiled": inner is not ddp, "auto_bucket": auto}


# PyTorch's DDP warns once per process when a gradient's strides differ from its bucket view's.
GRAD_STRIDES = "Grad strides do not match bucket view strides"


def quiet_grad_strides_warning() -> None:
    """Silence DDP's "Grad strides do not match bucket view strides" warning in this rank process, where it
    says nothing about the variant measured.

    With gradient_as_bucket_view, a depthwise convolution's weight [C, 1, k, k] has strides (k*k, k*k, k, 1),
    and where its input is channels-last (ConvNeXt's 7x7 blocks: their LayerNorm permutes) the backward makes
    a channels-last gradient, strides (k*k, 1, k, 1): they differ only in the size-1 dimension, so both lie
    in memory alike, and the reducer copies the gradient into its bucket as it would any other. (The harness
    sets gradients to None after each step, so every iteration's fresh gradient is copied into the bucket
    view anyway; that copy is part of what the variant measures.)
    """
    warnings.filterwarnings("ignore", message=GRAD_STRIDES, category=UserWarning)


def measure_block(rank: int, world_size: int, variants: dict[str, dict], session: str) -> dict:
    """On one rank: build a replica per variant (name -> RunConfig fields), warm each up, then run the
    rounds (each config's `iters`), one iteration per variant per round in a shuffled order. Returns, per
    variant, the seconds of its iteration in each round (the slowest rank's), its position in each round's
    order, its warm-up and build seconds (the slowest rank's), what its DDP reports (`observe`), and the
    CPU seconds all ranks spent on the block (to tell how busy other processes kept the machine)."""
    import torch.distributed as dist

    from experiments.measure import harness
    from experiments.measure.memory import released_by

    cpu_start = time.process_time()
    configs = {name: RunConfig(**fields) for name, fields in variants.items()}
    if any(c.bucket_view for c in configs.values()):
        quiet_grad_strides_warning()
    names = list(configs)
    rounds = configs[names[0]].iters
    # A replica runs a little faster or slower depending on where its memory landed; building in a
    # shuffled order keeps the default from always getting the first (freshest) memory.
    trainees, build_s = {}, {}
    for name in random.Random(f"{session}-build").sample(names, len(names)):
        started = time.perf_counter()
        trainees[name] = harness.build(rank, configs[name])
        build_s[name] = time.perf_counter() - started
    device = trainees[names[0]].device
    clock = harness.Clock(device)

    def iteration(name: str) -> float:
        t = trainees[name]
        clock.start()
        harness.train_step(t.ddp, t.family, t.batch, t.optimizer, True, clock.mark, t.precision)
        return clock.seconds()["optimizer"]

    warmup_s, tuning_s = {}, {}
    for name in names:  # the first iteration of a compiled variant compiles: minutes, on a CPU
        if configs[name].bucket_mb == AUTO_CAP:  # ddp_core chooses its cap first, in iterations of its own
            tuning_s[name] = harness.tune_bucket_cap(trainees[name], trainees[name].ddp, clock)["iterations_s"]
        warmup_s[name] = sum(iteration(name) for _ in range(configs[name].warmup))
    local = {name: [] for name in names}
    positions = {name: [] for name in names}
    for index in range(rounds):
        order = random.Random(f"{session}-{index}").sample(names, len(names))
        for position, name in enumerate(order):
            positions[name].append(position)
            local[name].append(iteration(name))
    # An iteration takes as long as its slowest rank: gather every variant's times in one go.
    slowest = harness.slowest_per_iteration([s for name in names for s in local[name]])
    observed = {name: observe(trainees[name].ddp) for name in names}
    # What each replica held once trained (weights, gradients, DDP's buckets, optimizer and hook state): the
    # memory per option, as what deleting it gives back. Every rank deletes in the same order (a DDP's
    # destructor may talk to its process group).
    held = {name: released_by(lambda: trainees.pop(name), device) for name in names}
    setup = [None] * dist.get_world_size()
    dist.all_gather_object(setup, {"warmup_s": warmup_s, "tuning_s": tuning_s, "build_s": build_s, "held_mb": held,
                                   "cpu_s": time.process_time() - cpu_start})
    ranks_cpu_s = sum(s["cpu_s"] for s in setup)
    return {name: {"latency_s": slowest[i * rounds:(i + 1) * rounds], "positions": positions[name],
                   "warmup_s": max(s["warmup_s"][name] for s in setup), "build_s": max(s["build_s"][name] for s in setup),
                   "held_mb": max(s["held_mb"][name] for s in setup), "observed": observed[name],
                   # bucket_auto: its tuning iterations, each the slowest rank's (none of them measured)
                   "tuning_s": [max(t) for t in zip(*(s["tuning_s"][name] for s in setup))] if name in tuning_s else None,
                   "ranks_cpu_s": ranks_cpu_s}
            for i, name in enumerate(names)}

