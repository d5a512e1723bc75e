"""How long an all-reduce takes: a ring model fitted to this machine, or a named cluster preset.

The ring all-reduce of n bytes over p ranks costs `2(p-1)·alpha + 2((p-1)/p)·n·beta`: 2(p-1) steps,
each paying a latency alpha, and every rank sending and receiving 2(p-1)/p of the data at 1/beta
bytes per second (nccl-tests calls 1/beta the bus bandwidth). `fit` finds alpha and beta from the
all-reduce microbenchmark's records; a cluster preset states them per link, inside a server and
between servers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Link:
    """One level of a network: latency per ring step (s) and bus bandwidth (bytes/s)."""

    alpha: float
    busbw: float

    def allreduce(self, nbytes: float, ranks: int) -> float:
        """Ring all-reduce seconds for `nbytes` over `ranks`."""
        if ranks <= 1:
            return 0.0
        return 2 * (ranks - 1) * self.alpha + 2 * (ranks - 1) / ranks * nbytes / self.busbw

    def broadcast(self, nbytes: float, ranks: int) -> float:
        """Pipelined ring broadcast seconds (used for buffers before each forward)."""
        return 0.0 if ranks <= 1 or nbytes == 0 else (ranks - 1) * self.alpha + nbytes / self.busbw


@dataclass(frozen=True)
class Interference:
    """How much compute slows while communication runs beside it, as a probe measured it
    (perfmodel/interference.py): extra seconds of compute per byte all-reduced while compute runs,
    beyond what the model charges already (on shared cores: beyond doing both one after the other)."""

    seconds_per_byte: float  # what the model adds: the measured term, or 0 where that is negative
    slowdown: float  # the probe's backward beside its all-reduce against alone, minus 1 (for the reader)
    source: str  # which probe: model, bytes, machine, when
    measured: float | None = None  # the probe's median term as measured (seconds per byte; may be negative)

    def describe(self) -> str:
        """`+0.31 ms per MB reduced beside compute (probe of ...)`, or why no slowdown is modelled."""
        measured = self.seconds_per_byte if self.measured is None else self.measured
        if measured < 0:
            return (f"+0 ms per MB: side by side measured {measured * 1e9:.2f} ms per MB cheaper than one after the "
                    f"other, a gain the model does not take ({self.source})")
        return f"{self.seconds_per_byte * 1e9:+.2f} ms per MB reduced beside compute ({self.source})"


@dataclass(frozen=True)
class CommModel:
    """Collective costs on a machine or a cluster of servers with `per_server` ranks each.

    `shares_cores`: communication runs on the cores that compute (Gloo on a CPU): the two cannot
    overlap, whatever the schedule; on GPUs communication has its own engines and streams.
    `cpu`: where the wire is elsewhere but each all-reduce still costs the compute cores some work
    (Gloo on a CPU over a real or emulated link: copies, sums, the TCP stack), that work's cost.
    """

    name: str
    intra: Link
    inter: Link | None = None  # None: every rank is on one machine
    per_server: int = 0
    shares_cores: bool = False
    source: str = ""
    cpu: Link | None = None
    gpus: tuple[str, ...] = ()  # a cluster preset's GPUs, e.g. ("h100", "h200"): what its compute should be of
    interference: Interference | None = None  # None: compute is taken not to slow beside communication
    # what a fit rests on: {"world_sizes": (...), "max_bytes": ...}; None for a preset (see uncertainty.py)
    measured: dict | None = None

    def link(self, ranks: int) -> Link:
        """The link that bounds a ring over `ranks`: the slowest level the ring crosses."""
        if self.inter is None or ranks <= self.per_server:
            return self.intra
        return Link(alpha=max(self.intra.alpha, self.inter.alpha), busbw=min(self.intra.busbw, self.inter.busbw))

    def allreduce(self, nbytes: float, ranks: int) -> float:
        """Seconds to all-reduce `nbytes` over `ranks`."""
        return self.link(ranks).allreduce(nbytes, ranks)

    def on_compute_cores(self, ranks: int) -> bool:
        """Whether a ring over `ranks` runs on the cores that compute, so that nothing overlaps:
        Gloo on a CPU, or on an emulated cluster a ring that stays inside one host."""
        return self.shares_cores or (self.cpu is not None and self.link(ranks) is self.intra)

    def latency(self, ranks: int) -> float:
        """The part of an all-reduce that does not depend on its size."""
        return self.link(ranks).allreduce(0, ranks)

    def broadcast(self, nbytes: float, ranks: int) -> float:
        """Seconds to broadcast `nbytes` from one rank to `ranks`."""
        return self.link(ranks).broadcast(nbytes, ranks)


@dataclass(frozen=True)
class Fit:
    """A fitted model and how well it reproduces the records it was fitted to."""

    model: CommModel
    rows: list[dict]  # per record: bytes, calls, ranks, measured and predicted seconds, relative error
    median_error: float
    worst_error: float


def fit(records: list[dict], backend: str, device: str, world_size: int | None = None) -> Fit:
    """Fit alpha and beta to all-reduce records (both modes) of one backend, device and world size.

    Ranks on one machine share its cores, so that a ring of more ranks is slower per byte than the
    formula says: each world size gets a fit of its own, by default the smallest one recorded (>= 2).

    Each record is a number of calls of equal size, launched back to back and waited for together:
    its time is modelled as `calls · 2(p-1)·alpha + calls · 2((p-1)/p)·bytes_per_call·beta`. The
    least-squares fit weighs every record by 1/time, i.e. minimises relative errors, so that the
    small messages (latency-bound) count as much as the large ones; alpha and beta are kept >= 0.
    """
    from scipy.optimize import nnls  # here, not at the top: the command line imports this module for CLUSTERS

    mine = [r for r in records if r.get("kind") == "allreduce" and r["status"] == "ok"
            and r["config"]["backend"] == backend and r["config"]["device"] == device and r["config"]["world_size"] >= 2
            and r["config"].get("link", "none") == "none"]  # (records over emulated links measure the link)
    if world_size is None and mine:
        world_size = min(r["config"]["world_size"] for r in mine)
    rows = []
    for r in mine:
        c = r["config"]
        if c["world_size"] != world_size:
            continue
        p, calls = c["world_size"], math.ceil(c["total_elements"] / c["elements"])
        rows.append({"bytes_per_call": c["elements"] * 4, "calls": calls, "ranks": p, "mode": c["mode"],
                     "measured_s": float(np.median(r["latency_s"]))})
    if len(rows) < 2:
        raise ValueError(f"need at least 2 all-reduce records for backend={backend!r} device={device!r} at world "
                         f"size {world_size or '>= 2'}, found {len(rows)}; run `ddpbench allreduce` first")
    design = np.array([[row["calls"] * 2 * (row["ranks"] - 1),
                        row["calls"] * 2 * (row["ranks"] - 1) / row["ranks"] * row["bytes_per_call"]] for row in rows])
    measured = np.array([row["measured_s"] for row in rows])
    (alpha, beta), _ = nnls(design / measured[:, None], np.ones(len(rows)))
    predicted = design @ np.array([alpha, beta])
    for row, pred in zip(rows, predicted):
        row["predicted_s"] = float(pred)
        row["error"] = float(pred / row["measured_s"] - 1)
    errors = np.abs([row["error"] for row in rows])
    busbw = 1 / beta if beta > 0 else math.inf
    model = CommModel(name=f"{backend}-{device} (fitted)", intra=Link(alpha=float(alpha), busbw=float(busbw)),
                      shares_cores=device == "cpu",
                      source=f"fitted to {len(rows)} all-reduce records; median |error| {np.median(errors):.0%}",
                      measured={"world_sizes": (world_size,), "max_bytes": max(row["bytes_per_call"] for row in rows)})
    return Fit(model, rows, float(np.median(errors)), float(errors.max()))


def emulated(machine: CommModel, link: str, rate_bps: float, ranks_per_host: int) -> CommModel:
    """The network of `ddpbench run --link`: hosts of `ranks_per_host` ranks joined by links of
    `rate_bps` as configured (not fitted to any run), on a machine whose all-reduce fit is `machine`.

    Inside a host the ranks share its loopback and cores, as `machine` describes. Between hosts the
    wire carries the bytes at the link's rate in each direction (bus bandwidth = rate / 8 bytes/s),
    while the cores still do Gloo's share: the work an all-reduce costs them on this machine, taken
    as the fitted loopback cost (an upper bound: it includes the loopback's copy through the kernel).
    """
    if not machine.shares_cores:
        raise ValueError(f"an emulated link needs this machine's fitted all-reduce, not {machine.name!r}")
    return CommModel(name=f"emulated {link} link", intra=machine.intra, per_server=ranks_per_host,
                     inter=Link(alpha=machine.intra.alpha, busbw=rate_bps / 8), cpu=machine.intra,
                     interference=machine.interference, measured=machine.measured,
                     source=f"{link} as configured (bus bandwidth {rate_bps / 8 / GB:.3f} GB/s), {ranks_per_host} rank(s) "
                            f"per host; per-step latency and the cores' share from this machine's fit "
                            f"(alpha {machine.intra.alpha * 1e6:.0f} us, {machine.intra.busbw / GB:.2f} GB/s)")


def scale_model(loopback: CommModel, link: str, rate_bps: float | None, ranks_per_host: int,
                dilation: float) -> CommModel:
    """The network of a scale-model run (`ddpbench run --compute emulated`), undilated.

    Emulated compute only waits, so the cores are free for communication, which overlaps it as on
    GPUs. Ranks of one host talk over this machine's loopback, fitted at the run's world size (all its
    ranks share these cores), and time dilation K makes it K times faster than measured; hosts are
    joined by links at the configured rate (the emulation shapes them at rate / K).
    """
    intra = Link(alpha=loopback.intra.alpha / dilation, busbw=loopback.intra.busbw * dilation)
    inter = None if link == "none" else Link(alpha=intra.alpha, busbw=rate_bps / 8)
    where = "one host" if inter is None else f"hosts of {ranks_per_host} rank(s) behind {link} links"
    return CommModel(name=f"scale model: {where}, time dilation {dilation:g}", intra=intra, inter=inter,
                     per_server=ranks_per_host if inter is not None else 0,
                     source=f"{where}; inside a host this machine's loopback ({loopback.source}) x {dilation:g}")


GB = 1e9
# Achievable bus bandwidth is below the wire rate: NCCL's maintainer puts the protocol overhead on
# NVLink at about 20% (NVIDIA/nccl-tests issue 212); we apply the same 0.8 to NVLink, 0.9 to InfiniBand.
NVLINK_EFFICIENCY, IB_EFFICIENCY = 0.8, 0.9

CLUSTERS: dict[str, CommModel] = {
    "paper-v100-nccl": CommModel(
        name="paper-v100-nccl", per_server=8, gpus=("v100",),
        intra=Link(alpha=5e-6, busbw=NVLINK_EFFICIENCY * 150 * GB),
        inter=Link(alpha=10e-6, busbw=IB_EFFICIENCY * 12.5 * GB),
        source="the paper's testbed: 8 V100 per server, NVLink 2.0 (6 links x 25 GB/s per direction = 150 GB/s, "
               "V100 datasheet), 100 Gb/s = 12.5 GB/s between servers (one NIC per server; as the paper describes its testbed, approx.); "
               "alpha 5 us inside a server and 10 us across (an assumption of NCCL's per-step latency); ring only"),
    "paper-v100-gloo": CommModel(
        name="paper-v100-gloo", per_server=8, gpus=("v100",),
        intra=Link(alpha=20e-6, busbw=5 * GB),
        inter=Link(alpha=50e-6, busbw=2.5 * GB),
        source="the paper's testbed with Gloo: GPU tensors staged through host memory and TCP; 5 GB/s and 20 us "
               "per step inside a server, 2.5 GB/s and 50 us across (about one TCP stream per rank pair on "
               "100 Gb/s) are assumptions, not measurements - fit your own with `ddpbench allreduce --backend gloo`"),
    "dgx-a100-nccl": CommModel(
        name="dgx-a100-nccl", per_server=8, gpus=("a100",),
        intra=Link(alpha=4e-6, busbw=NVLINK_EFFICIENCY * 300 * GB),
        inter=Link(alpha=9e-6, busbw=IB_EFFICIENCY * 8 * 25 * GB),
        source="DGX A100 from NVIDIA's datasheet: NVLink 3 through NVSwitch (12 links x 25 GB/s = 300 GB/s per "
               "direction per GPU), eight 200 Gb/s (25 GB/s) HDR InfiniBand ports per server, one per GPU, used by "
               "parallel rings; alphas assumed (between the V100's and the H100's), not measured"),
    "h100-400g-nccl": CommModel(
        name="h100-400g-nccl", per_server=8, gpus=("h100", "h200"),
        intra=Link(alpha=3e-6, busbw=NVLINK_EFFICIENCY * 450 * GB),
        inter=Link(alpha=8e-6, busbw=IB_EFFICIENCY * 50 * GB),
        source="8 H100/H200 per server, NVLink 4 (18 links, 900 GB/s both directions = 450 GB/s per direction), "
               "400 Gb/s = 50 GB/s between servers (one link per server, as the issue states it); alphas assumed"),
    "dgx-h100-nccl": CommModel(
        name="dgx-h100-nccl", per_server=8, gpus=("h100", "h200"),
        intra=Link(alpha=3e-6, busbw=NVLINK_EFFICIENCY * 450 * GB),
        inter=Link(alpha=8e-6, busbw=IB_EFFICIENCY * 8 * 50 * GB),
        source="DGX H100/H200 reference design: NVLink 4 inside (450 GB/s per direction), and eight 400 Gb/s "
               "ConnectX-7 ports per server, one per GPU (DGX H100 user guide), used by parallel rings; alphas assumed"),
}
