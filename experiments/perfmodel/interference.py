"""The interference term: how much compute slows while communication runs beside it.

On a CPU, Gloo reduces on the cores that run backward: with overlap, the two run side by side and, on
this 2-core machine, could cost more than one after the other, which the model does not charge (a gap
once measured for ViT-B/16 turned out to be the first config of fresh ranks running slower:
performance-model.md). On a GPU, NCCL's
kernels take SMs and memory bandwidth from the backward they overlap. The probe measures it on the
machine at hand, in seconds (`ddpbench profile` and `advise` run it):

1. the ranks that will share the host (2 on a CPU; the GPUs there are, up to 2, on CUDA) build the
   model and a flat buffer of its gradient bytes;
2. each round, in alternation, after one untimed round: (A) backward alone; (B) an all-reduce of the
   buffer alone; (C) the same all-reduce launched asynchronously (Gloo's thread, NCCL's stream) right
   before the same backward: the backward's time and the time until both are done;
3. on shared cores (device cpu), then, DDP's own overlap: the model in ddp_core (25 MB buckets), each
   round a whole training iteration (D) with overlap and (E) without (forward, backward until every
   bucket is reduced and written back, an SGD step), and with (D) the bytes of the buckets launched
   while backward still produced gradients;
4. per round, the slowest rank sets each time (a synchronised job runs at its slowest rank's pace).

From that (per round, then the median; `Interference.measured`):
- on shared cores, `(D - E) / bytes launched beside backward`: the model charges backward and every
  all-reduce one after the other either way, so what overlap costs beyond no overlap is the term. One
  all-reduce of the whole buffer beside backward (C) did not show it: on a quiet 2-core machine side by
  side measured as cheap as one after the other for ResNet50, BERT-base and ViT-B/16. (D) and (E)
  measure DDP itself (many buckets launched from gradient hooks, their copies, Gloo's threads beside
  backward's). The simulation counts the same bytes: those of the buckets ready before the last
  gradient. On a quiet machine (D) too measured overlap no dearer for all three (ResNet50 +0.03 ms per
  MB, the others cheaper), as `ddpbench run` does once every config meets settled ranks;
- on GPUs, `(C's backward - A) / bytes beside backward`, where the bytes beside backward are the
  buffer's times the share of the lone all-reduce that fits in the lone backward (min(1, A/B)), as the
  simulation counts them (the model charges compute nothing for communication there).
The model adds that term where it is positive (`Interference.seconds_per_byte`); a negative one (side
by side cheaper: one rank's Gloo thread waits on the network while its compute runs) is kept in the
record and named, but not modelled - the term is a slowdown. Records made before (D)/(E) existed give,
on shared cores, `(C's both done - A - B)` over the bytes beside backward.
The record (`kind: interference`) is stored with the all-reduce records the fit reads; the model uses
the newest probe of the predicted model, else the newest of any model, else none and says so.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import time
from dataclasses import dataclass

from ddp_core.observer import ReducerObserver
from experiments.core.config import RunConfig
from experiments.perfmodel.comm import Interference

ROUNDS, WARMUP = 5, 1


@dataclass(frozen=True)
class InterferenceConfig:
    """One probe: the model and inputs whose backward is timed, beside an all-reduce of its gradient bytes."""

    model: str
    backend: str
    device: str
    world_size: int
    threads: int
    batch_size: int
    image_size: int
    seq_len: int
    model_config: str = ""
    amp: str = "none"
    model_hash: str = ""
    rounds: int = ROUNDS
    warmup: int = WARMUP
    seed: int = 0
    link: str = "none"
    ranks_per_host: int = 1


def probe_config(config: RunConfig, world_size: int) -> InterferenceConfig:
    """The probe of `config`'s model, inputs and threads, in a world of `world_size` ranks sharing this host."""
    return InterferenceConfig(model=config.model, backend=config.backend, device=config.device, world_size=world_size,
                              threads=config.threads, batch_size=config.batch_size, image_size=config.image_size,
                              seq_len=config.seq_len, model_config=config.model_config, amp=config.amp,
                              model_hash=config.model_hash, seed=config.seed)


def ranks_here(device: str) -> int:
    """How many ranks the probe runs: 2 sharing a CPU host; on CUDA the GPUs there are, up to 2
    (NCCL refuses two ranks on one GPU: with one GPU its all-reduce runs alone, a world of one)."""
    if device != "cuda":
        return 2
    import torch

    return min(2, torch.cuda.device_count())


def measure(rank: int, world_size: int, fields: dict) -> dict:
    """On each rank: the rounds of (A) backward alone, (B) all-reduce alone, (C) both; raw seconds."""
    import torch
    import torch.distributed as dist

    from experiments.core.machine import busy_cpu_seconds
    from experiments.measure.amp import Precision
    from experiments.measure.harness import rank_device
    from experiments.measure.workloads.spec import load as load_workload

    config = InterferenceConfig(**fields)
    device = rank_device(rank, config.device)
    torch.manual_seed(config.seed)
    family = load_workload(config.model, config.model_config, config.image_size, config.seq_len, config.model_hash)
    model = family.build().to(device)
    generator = torch.Generator().manual_seed(config.seed * 1000 + rank)
    batch = {k: v.to(device) for k, v in family.make_batch(model, config.batch_size, config.image_size,
                                                          config.seq_len, generator).items()}
    precision = Precision(config.amp, device)
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    flat = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)

    def settle():  # the compute stream only: on CUDA, NCCL's stream must not be waited for here
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()

    def loss(module=model):
        model.zero_grad(set_to_none=True)
        with precision.autocast():
            return family.loss(module, batch)

    samples = {"backward_alone": [], "allreduce_alone": [], "backward_beside": [], "both_done": []}
    cpu_start = wall = own = None
    for i in range(config.warmup + config.rounds):
        if i == config.warmup:
            cpu_start, wall, own = busy_cpu_seconds(), time.perf_counter(), time.process_time()
        times = {}
        value = loss()  # (A) backward alone; the forward is not timed
        settle()
        dist.barrier()  # every rank starts each part together, as DDP's ranks compute together
        start = time.perf_counter()
        precision.backward(value)
        settle()
        times["backward_alone"] = time.perf_counter() - start
        dist.barrier()  # (B) the all-reduce alone
        start = time.perf_counter()
        dist.all_reduce(flat)
        settle()
        times["allreduce_alone"] = time.perf_counter() - start
        value = loss()  # (C) both: the all-reduce launched, then backward beside it
        settle()
        dist.barrier()
        start = time.perf_counter()
        work = dist.all_reduce(flat, async_op=True)
        precision.backward(value)
        settle()
        times["backward_beside"] = time.perf_counter() - start
        work.wait()  # (on CUDA: the compute stream waits for NCCL's, then settles)
        settle()
        times["both_done"] = time.perf_counter() - start
        if i >= config.warmup:
            for key, seconds in times.items():
                samples[key].append(seconds)
        flat.fill_(1.0)  # sums of sums would overflow to inf after enough rounds
    if config.device == "cpu":
        samples.update(_ddp_rounds(model, loss, precision, config))
    cpu_end, wall, own = busy_cpu_seconds(), time.perf_counter() - wall, time.process_time() - own
    busy = None if None in (cpu_start, cpu_end) else (cpu_end - cpu_start) / wall
    # This rank's own cores (all its threads: compute and Gloo's): what is left of `busy` is other work.
    return {**samples, "bytes": flat.numel() * 4, "cores_busy": busy, "own_cores": own / wall,
            "load_average": os.getloadavg()[0]}


class _LaunchedBeside(ReducerObserver):
    """Reducer observer: the bytes of the buckets launched while backward still had gradients to produce
    (all but those launched by the last gradient, which start when backward has ended)."""

    def __init__(self, reducer):
        self.reducer, self.ready, self.bytes = reducer, 0, 0

    def parameter_ready(self, index: int) -> None:
        """Count a gradient in its bucket."""
        self.ready += 1

    def bucket_launched(self, index: int, future) -> None:
        """Add the bucket's bytes unless the last gradient launched it."""
        if self.ready < len(self.reducer.params):
            buffer = self.reducer.buckets[index].buffer()
            self.bytes += buffer.numel() * buffer.element_size()


def _ddp_rounds(model, loss, precision, config: InterferenceConfig) -> dict:
    """(D) and (E) on shared cores: ddp_core's training iteration with overlap and without, alternating,
    after one untimed round of each (the buckets are rebuilt after the first). Each is timed whole -
    forward, backward until every bucket is reduced and written back, an SGD step - since what overlap
    costs need not show in backward alone; with (D), the bytes launched beside backward."""
    import torch
    import torch.distributed as dist

    from ddp_core import DistributedDataParallel

    ddp = DistributedDataParallel(model, bucket_cap_mb=25.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)
    samples = {"ddp_overlap": [], "ddp_no_overlap": [], "launched_beside_bytes": []}
    for i in range(config.warmup + config.rounds):
        for overlap in (True, False):
            ddp.reducer.overlap = overlap
            observer = ddp.reducer.observer = _LaunchedBeside(ddp.reducer)
            dist.barrier()  # both ranks start each iteration together, as the last bucket's wait leaves them
            start = time.perf_counter()
            precision.backward(loss(ddp))
            precision.step(optimizer)
            seconds = time.perf_counter() - start
            if i >= config.warmup:
                samples["ddp_overlap" if overlap else "ddp_no_overlap"].append(seconds)
                if overlap:
                    samples["launched_beside_bytes"].append(observer.bytes)
    ddp.reducer.observer = None
    return samples


def run_probes(probes: list[InterferenceConfig], out, resume: bool = False, timeout: float = 600.0,
               echo=None) -> dict:
    """Run each probe on its ranks and append its record to `out` (see sweep.run_jobs); one line per probe
    with the term it gives. Returns counts of ok, failed and skipped probes."""
    import sys

    from experiments.measure.sweep import run_jobs

    echo = echo or (lambda line: print(line, file=sys.stderr))

    def say(job, record, per_rank):
        if record["status"] == "ok":
            echo(f"interference: {from_record(record).describe()}")

    return run_jobs(probes, out, measure, make_record, "interference", resume=resume, timeout=timeout,
                    on_record=say, echo=echo)


def make_record(config: InterferenceConfig, per_rank: list[dict], wall_s: float) -> dict:
    """The probe's record: per round, the slowest rank's time of each part; the term it gives."""
    parts = ("backward_alone", "allreduce_alone", "backward_beside", "both_done")
    busy = per_rank[0]["cores_busy"]
    if "ddp_overlap" in per_rank[0]:  # shared cores: DDP's own overlap, and the bytes it launched beside backward
        parts += ("ddp_overlap", "ddp_no_overlap")
    record = {"kind": "interference", "status": "ok", "config": dataclasses.asdict(config),
              "bytes": per_rank[0]["bytes"],
              **{f"{part}_s": [max(ts) for ts in zip(*(r[part] for r in per_rank))] for part in parts},
              **({"launched_beside_bytes": per_rank[0]["launched_beside_bytes"]}
                 if "launched_beside_bytes" in per_rank[0] else {}),
              "timing": {"config_wall_s": wall_s, "cores_busy": busy, "load_average": per_rank[0]["load_average"],
                         # the machine's busy cores less the probe's own ranks: other people's work meanwhile
                         "other_cores_busy": None if busy is None else max(0.0, busy - sum(r["own_cores"]
                                                                                        for r in per_rank))}}
    term = from_record(record)
    record["summary"] = {"p50": statistics.median(record["backward_beside_s"]), "measured_s_per_byte": term.measured,
                         "seconds_per_byte": term.seconds_per_byte, "slowdown": term.slowdown,
                         "spread_s_per_byte": _spread(record)}
    return record


def shares_cores(record: dict) -> bool:
    """Whether the probe's communication ran on its compute cores (Gloo on a CPU)."""
    return record["config"]["device"] == "cpu"


def per_round(record: dict) -> list[float]:
    """Each round's extra seconds per byte reduced beside backward (see the module's docstring)."""
    if "ddp_overlap_s" in record:  # shared cores: what DDP's overlap costs beyond no overlap, per byte launched beside
        # (a model of one bucket launches nothing beside backward: overlap cannot cost it anything)
        return [(on - off) / launched if launched else 0.0 for on, off, launched in
                zip(record["ddp_overlap_s"], record["ddp_no_overlap_s"], record["launched_beside_bytes"])]
    terms = []
    for alone, reduce, beside, done in zip(record["backward_alone_s"], record["allreduce_alone_s"],
                                           record["backward_beside_s"], record["both_done_s"]):
        beside_bytes = record["bytes"] * min(1.0, alone / reduce) if reduce > 0 else record["bytes"]
        extra = done - alone - reduce if shares_cores(record) else beside - alone
        terms.append(extra / beside_bytes)
    return terms


def _spread(record: dict) -> list[float]:
    """The interquartile range of the per-round terms (seconds per byte)."""
    terms = per_round(record)
    if len(terms) < 2:
        return [terms[0], terms[0]]
    q = statistics.quantiles(terms, n=4)
    return [q[0], q[2]]


def from_record(record: dict) -> Interference:
    """The term an interference record gives: the median over its rounds."""
    c = record["config"]
    alone, beside = statistics.median(record["backward_alone_s"]), statistics.median(record["backward_beside_s"])
    when = (record.get("env") or {}).get("time", "")
    other = (record.get("timing") or {}).get("other_cores_busy")
    load = f", {other:.1f} cores busy with other work" if other is not None else ""
    # NCCL's all-reduce in a world of one (a machine with one GPU) moves no data between ranks.
    alone_world = c["world_size"] == 1
    measured = statistics.median(per_round(record))
    # A slowdown only: where side by side measured cheaper than one after the other (Gloo's threads waiting
    # on the network while the other computes), the model keeps its baseline and adds nothing.
    if "ddp_overlap_s" in record:
        on, off = statistics.median(record["ddp_overlap_s"]), statistics.median(record["ddp_no_overlap_s"])
        what = (f"ddp_core {on * 1e3:.1f} ms with overlap, {off * 1e3:.1f} ms without, "
                f"{statistics.median(record['launched_beside_bytes']) / 1e6:.1f} MB launched beside it")
    else:
        what = (f"backward {alone * 1e3:.1f} ms alone, {beside * 1e3:.1f} ms beside an all-reduce of "
                f"{record['bytes'] / 1e6:.1f} MB{' of a world of one, which moves no data: a lower bound' if alone_world else ''}")
    return Interference(
        seconds_per_byte=max(0.0, measured), measured=measured, slowdown=beside / alone - 1,
        source=f"probe of {c['model']} on {c['device']} ({c['backend']}), {c['world_size']} rank(s): {what}"
               f"{load}{', ' + when if when else ''}")


def pick(records: list[dict], backend: str, device: str, world_size: int | None = None,
         model: str | None = None) -> Interference | None:
    """The newest probe of `backend` on `device` (at `world_size` ranks where given) among `records`:
    of `model` where one exists, else of any model; None where there is none."""
    mine = [r for r in records if r.get("kind") == "interference" and r.get("status") == "ok"
            and r["config"]["backend"] == backend and r["config"]["device"] == device
            and world_size in (None, r["config"]["world_size"])]
    same = [r for r in mine if r["config"]["model"] == model] or mine
    if not same:
        return None
    # the newest by the time measured (files in a folder are read by name, not by age); ties: the later line
    return from_record(max(enumerate(same), key=lambda item: ((item[1].get("env") or {}).get("time") or "", item[0]))[1])


def describe(term: Interference | None, why_none: str) -> str:
    """The line a prediction prints about its interference term."""
    if term is None:
        return f"interference: none modelled ({why_none}): compute is taken not to slow beside communication"
    return f"interference: {term.describe()}"
