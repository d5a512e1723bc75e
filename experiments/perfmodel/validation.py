"""How well the performance model predicts what was measured: predicted against measured latency for
every run that has a profile (the analysis scripts' tables of prediction errors)."""
from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path

from experiments.core.config import parse_rate
from experiments.core.profile import PROFILE_KEYS, Profile, config_value, find_profile
from experiments.core.records import read_records
from experiments.core.stats import cycle_means
from experiments.perfmodel.comm import CommModel, Link, emulated, fit, scale_model
from experiments.perfmodel.interference import pick
from experiments.perfmodel.simulate import Schedule, simulate


def describe_errors(errors: list[float]) -> str:
    """`median |error| x%, mean y%, worst z%; n of m low` for signed relative errors (predicted / measured - 1)."""
    if not errors:
        return "no runs"
    size = [abs(e) for e in errors]
    return (f"median |error| {statistics.median(size):.1%}, mean {statistics.mean(size):.1%}, worst {max(size):.1%}; "
            f"{sum(e < 0 for e in errors)} of {len(errors)} low")


def measured_latency(record: dict) -> float:
    """A run record's latency as the model predicts it: the median, or for reduce-every-n the median
    of the mean over each cycle of n iterations."""
    return statistics.median(cycle_means(record["latency_s"], record["config"]["sync_every"]))


def prediction_errors(runs: Path, backend: str = "gloo", device: str = "cpu", allreduce: Path | None = None,
                      interference: bool | Path = True) -> list[dict]:
    """Predicted against measured latency for every ddp_core run under `runs` that has a profile there.

    The network is fitted to the all-reduce records under `runs` (never to the runs themselves), or
    under `allreduce` where given. Runs with real compute take the interference term of the newest probe
    of their model among those records (or under `interference`, where it is a path), else of any
    model, else none (`interference=False`: none at all).
    """
    records = read_records(runs)
    fitted = read_records(allreduce) if allreduce is not None else records
    try:
        machine = fit(fitted, backend, device).model
    except ValueError:
        machine = None  # no loopback all-reduce records: only emulated-compute runs with their own fit are predicted
    found = read_records(interference) if isinstance(interference, Path) else [*fitted, *(records if allreduce else [])]
    probes = [r for r in found if r.get("kind") == "interference"]
    loopback: dict[int, CommModel] = {}  # per world size, for the scale model's hosts
    rows = []
    for record in records:
        c = record["config"]
        if (record.get("kind") != "run" or record["status"] != "ok" or c["impl"] == "torch"
                or c["comm_hook"] != "none" or c["backend"] != backend or c["device"] != device):
            continue
        link, ranks_per_host = c.get("link", "none"), c.get("ranks_per_host", 1)
        rate = None if link == "none" else parse_rate(link)
        if c.get("compute", "real") == "emulated":  # the stand-in replays its profile; the cores only communicate
            profile = _compute_profile(c, Path(runs))
            if profile is None or c["world_size"] not in loopback and not _fit_into(loopback, records, c, backend, device):
                continue
            comm = scale_model(loopback[c["world_size"]], link, rate, ranks_per_host, c["time_dilation"])
        else:
            if machine is None:
                continue
            env = record.get("env") or {}
            profile = find_profile(records, c, env.get("time"), env.get("machine_id"))
            term = pick(probes, backend, device, model=c["model"]) if interference else None
            here = dataclasses.replace(machine, interference=term)
            # Over an emulated link: the link's configured rate, never a fit to these runs.
            comm = here if link == "none" else emulated(here, link, rate, ranks_per_host)
        if profile is None:
            continue
        plan = Schedule(world_size=c["world_size"], bucket_mb=c["bucket_mb"], overlap=c["impl"] == "ddp_core",
                        sync_every=c["sync_every"], process_groups=c["process_groups"])
        predicted = simulate(profile, comm, plan).latency
        measured = measured_latency(record)
        rows.append({**{k: config_value(c, k) for k in ("model", "world_size", "bucket_mb", "impl", "sync_every",
                                                         "process_groups", *PROFILE_KEYS)}, "link": link,
                     "ranks_per_host": ranks_per_host, "compute": c.get("compute", "real"),
                     "time_dilation": c.get("time_dilation", 1.0), "busy_share": _busy_share(record),
                     "measured_s": measured, "predicted_s": predicted, "error": predicted / measured - 1,
                     "interference": None if comm.interference is None else comm.interference.source})
    return rows


def _busy_share(record: dict) -> float | None:
    """The share of the machine's cores busy during a run's measured iterations (None where unknown)."""
    busy, cores = (record.get("timing") or {}).get("cores_busy"), (record.get("env") or {}).get("cpu_count")
    return None if busy is None or not cores else busy / cores


def _compute_profile(config: dict, runs: Path) -> Profile | None:
    """The profile an emulated-compute run replayed: its --compute-profile, or a file of that name
    under `runs` (records moved with their profiles); None where neither exists."""
    from experiments.core.profile import ComputeProfileError, load_compute_profile

    path = Path(config["compute_profile"])
    folder = runs if runs.is_dir() else runs.parent
    for candidate in (path, folder / path.name):
        if candidate.exists():
            try:
                return load_compute_profile(candidate, config["model"], config["world_size"]).profile
            except ComputeProfileError:
                return None
    return None


def _fit_into(loopback: dict, records: list[dict], config: dict, backend: str, device: str) -> bool:
    """Fit this machine's loopback all-reduce at the config's world size into `loopback`; False where
    too few records of that world size exist (`scale_loopback` of the main job measures them)."""
    if config["world_size"] == 1:  # one rank communicates with nobody
        loopback[1] = CommModel(name="one rank", intra=Link(alpha=0.0, busbw=math.inf))
        return True
    try:
        loopback[config["world_size"]] = fit(records, backend, device, config["world_size"]).model
    except ValueError:
        return False
    return True

