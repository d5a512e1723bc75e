"""DDP's schedule replayed on paper: predicted per-iteration latency and where it goes.

One synchronised iteration, as ddp_core runs it:
1. forward (after broadcasting buffers from rank 0);
2. backward produces gradients at the profiled times; gradients are assigned to buckets exactly as
   ddp_core assigns them (in arrival order, under the caps);
3. a bucket is launched once it is complete and every earlier bucket was launched (or, without
   overlap, all at the end of backward); bucket i goes to process group i mod k; each group is one
   channel that reduces its buckets in order. Channels overlap their latency but share the link's
   bandwidth, which serves one bucket at a time;
4. after backward, wait for the last bucket, write back (the profile's tail), step the optimizer.
   (ddp_core writes each bucket back as soon as it is reduced, so where the link is the bottleneck
   part of the tail hides behind later buckets; the model keeps the whole tail: slightly pessimistic.)
Where communication runs on the compute cores (Gloo on a CPU), nothing overlaps: the cores do the
backward and every all-reduce one after the other. Over a link (`ddpbench run --link`) the wire
works apart from the cores, which still do each all-reduce's CPU share: the iteration waits for
whichever finishes later, the cores or the wire.
Interference (a probe's term, `interference.py`; none without one): backward computes more slowly
while an all-reduce runs beside it. On a CPU the bytes of the buckets launched before the last
gradient, times the probe's seconds per byte, are added to the cores' work; on GPUs each bucket's
all-reduce, timed at full speed from its launch, lies partly inside backward, and that many bytes times
the term are added to backward, which then readies its gradients that much later. With reduce-every-n, n-1 iterations only compute
(forward and a local backward) and the n-th synchronises; the prediction is the mean over the cycle.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from experiments.core.profile import Profile
from experiments.perfmodel.comm import CommModel


@dataclass(frozen=True)
class Schedule:
    """What DDP does in one iteration: the knobs the paper varies."""

    world_size: int
    bucket_mb: float = 25.0
    first_bucket_mb: float = 1.0
    overlap: bool = True
    sync_every: int = 1
    process_groups: int = 1


@dataclass
class Prediction:
    """Predicted seconds per iteration (mean over a skip-sync cycle) and its parts."""

    latency: float
    breakdown: dict[str, float]  # of the synchronised iteration: forward, backward, exposed_comm, tail, optimizer
    buckets: list[dict] = field(default_factory=list)  # per bucket: bytes, ready, start, done (s after backward start)
    interference: float = 0.0  # seconds of exposed_comm that are compute slowed beside communication


def buckets_of(profile: Profile, bucket_mb: float, first_bucket_mb: float) -> list[list[int]]:
    """ddp_core's buckets for this profile: parameters in the order their gradients arrived."""
    # ddp_core's package imports torch (seconds); the command line imports this module only to parse options.
    from ddp_core.bucketing import TensorSpec, assign_buckets

    order = sorted(range(len(profile.ready)), key=profile.ready.__getitem__)
    specs = [TensorSpec(n, dtype) for n, dtype in zip(profile.nbytes, profile.dtypes)]
    return assign_buckets(specs, order, bucket_mb, first_bucket_mb)


def simulate(profile: Profile, comm: CommModel, schedule: Schedule) -> Prediction:
    """Predict the per-iteration latency of `schedule` for the profiled model on `comm`'s network."""
    p = schedule.world_size
    forward = profile.forward + comm.broadcast(profile.buffer_bytes, p)
    buckets = []
    for indices in buckets_of(profile, schedule.bucket_mb, schedule.first_bucket_mb):
        ready = max(profile.ready[i] for i in indices) if schedule.overlap else profile.backward
        buckets.append({"bytes": sum(profile.nbytes[i] for i in indices), "ready": ready})

    comm_total = sum(comm.allreduce(b["bytes"], p) for b in buckets)
    # Interference: compute that runs beside a bucket's all-reduce is stretched by the probe's seconds per
    # byte, for the bytes reduced while backward still runs (the share of each all-reduce inside backward,
    # each timed at full speed from its launch).
    per_byte = comm.interference.seconds_per_byte if comm.interference is not None and p > 1 else 0.0
    shared = comm.on_compute_cores(p)
    timeline = [dict(b) for b in buckets] if shared else buckets  # (shared cores: no timeline of their own)
    wire = _replay(timeline, comm, p, schedule.process_groups)
    # Bytes beside backward, as the probe counts them: on a CPU (shared cores, or the cores' side of a link)
    # those of the buckets launched before the last gradient; on GPUs each all-reduce's share inside backward.
    if comm.shares_cores or comm.cpu is not None:
        extra = per_byte * _launched_beside(buckets)
    else:
        extra = per_byte * sum(b["bytes"] * _inside(b, profile.backward) for b in timeline)
    if shared:
        # The same cores do both, one after the other, plus what running them side by side costs beyond that.
        synchronised_backward = profile.backward + comm_total + extra
    elif comm.cpu is not None:
        # The cores compute and do each all-reduce's CPU share; the wire carries the buckets meanwhile.
        cores = profile.backward + sum(comm.cpu.allreduce(b["bytes"], p) for b in buckets) + extra
        synchronised_backward = max(cores, wire)
    else:
        # Communication has its own engines (GPUs): a slower backward readies every gradient later.
        if extra:
            stretch = (profile.backward + extra) / profile.backward
            for bucket in buckets:
                bucket["ready"] *= stretch
            wire = _replay(buckets, comm, p, schedule.process_groups)
        synchronised_backward = max(profile.backward + extra, wire)
    exposed = synchronised_backward - profile.backward
    breakdown = {"forward": forward, "backward": profile.backward, "exposed_comm": exposed, "tail": profile.tail,
                 "optimizer": profile.optimizer}
    synchronised = sum(breakdown.values())
    skipped = profile.skipped_forward + comm.broadcast(profile.buffer_bytes, p) + profile.skipped_backward
    n = schedule.sync_every
    return Prediction(latency=((n - 1) * skipped + synchronised) / n, breakdown=breakdown, buckets=buckets,
                      interference=extra)


def _launched_beside(buckets: list[dict]) -> int:
    """Bytes of the buckets ready before the last one: launched while backward still ran (none without overlap,
    where every bucket is ready at the end)."""
    last = max((b["ready"] for b in buckets), default=0.0)
    return sum(b["bytes"] for b in buckets if b["ready"] < last)


def _inside(bucket: dict, backward: float) -> float:
    """The share of a bucket's all-reduce (its start to its end) that lies before the end of backward."""
    start, done = bucket["start"], bucket["done"]
    if done <= start:
        return 1.0 if start < backward else 0.0
    return min(1.0, max(0.0, (backward - start) / (done - start)))


def _replay(buckets: list[dict], comm: CommModel, ranks: int, channels: int) -> float:
    """Launch buckets in order over `channels`; returns when the last all-reduce completes (ddp_core's replay)."""
    # (imported here: ddp_core's package imports torch, and the command line imports this module to parse options)
    from ddp_core.schedule import replay

    return replay(buckets, lambda nbytes: comm.allreduce(nbytes, ranks), comm.latency(ranks), channels)
