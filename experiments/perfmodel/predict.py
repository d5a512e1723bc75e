"""Predictions as a library: the network model a prediction uses, one row per schedule, the recommended
bucket cap, and the text that describes them (`predict`, `tune-bucket`, `advise` and the analysis
scripts build on these; perfmodel/predict_command.py is their command line)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from experiments.core.config import ConfigError, parse_rate, validate_network
from experiments.core.profile import Profile
from experiments.core.records import read_records
from experiments.perfmodel.comm import CLUSTERS, CommModel, emulated, fit
from experiments.perfmodel.simulate import Schedule, simulate
from experiments.perfmodel.uncertainty import extrapolation, model_error, within_error

DEFAULT_CAPS = "0,1,5,10,25,50,100,200"  # the caps E3 measures, so that a recommendation can be checked


def comm_model(cluster: str | None, allreduce: Path | None, link: str = "none", ranks_per_host: int = 1,
               backend: str = "gloo", device: str = "cpu") -> CommModel:
    """The network: the cluster preset `cluster`, or a fit to this machine's all-reduce records under
    `allreduce` (of `backend` on `device`) with the newest interference probe among them, behind
    emulated links of rate `link` if one is given."""
    if cluster is not None:
        if cluster not in CLUSTERS:
            raise ConfigError(f"--cluster={cluster!r} is unknown; choose one of {', '.join(CLUSTERS)}")
        if link != "none":
            raise ConfigError("--link needs --allreduce (this machine's fit), not --cluster")
        return CLUSTERS[cluster]
    validate_network(link, ranks_per_host)
    from experiments.perfmodel.interference import pick

    try:
        records = read_records(allreduce)
        machine = fit(records, backend, device).model
    except (FileNotFoundError, ValueError) as error:
        raise ConfigError(f"--allreduce={str(allreduce)!r}: {error}") from None
    # The interference probe is stored with the all-reduce records: the newest comes with the fit.
    machine = dataclasses.replace(machine, interference=pick(records, backend, device))
    return machine if link == "none" else emulated(machine, link, parse_rate(link), ranks_per_host)


def with_interference(comm: CommModel, cluster: str | None, explicit: str | None, found: list[dict],
                      backend: str, device: str, model: str) -> tuple[CommModel, str]:
    """`comm` with the interference term a prediction uses, and the line that says which (or why none).

    `explicit` (--interference): `none`, or a record file or folder holding a probe (for a cluster
    preset, a GPU's: scripts/gpu_check.sh measures one). Otherwise, for this machine's fit, the newest
    probe of `model` among `found` (the --allreduce and --profile records), else of any model; for a
    cluster preset none, since no probe of its GPUs exists here."""
    from experiments.perfmodel import interference as probes

    if explicit == "none":
        return dataclasses.replace(comm, interference=None), probes.describe(None, "--interference none")
    if explicit is not None:
        try:
            records = read_records(Path(explicit))
        except (FileNotFoundError, ValueError) as error:
            raise ConfigError(f"--interference={explicit!r}: {error}") from None
        wanted = ("nccl", "cuda") if cluster is not None else (backend, device)
        term = probes.pick(records, *wanted, model=model)
        if term is None:
            raise ConfigError(f"--interference={explicit!r} holds no interference probe of backend={wanted[0]!r} on "
                              f"device={wanted[1]!r}" + (" (a GPU cluster takes a GPU's probe: scripts/gpu_check.sh "
                                                         "measures one)" if cluster is not None else ""))
        return dataclasses.replace(comm, interference=term), probes.describe(term, "")
    if cluster is not None:
        return comm, probes.describe(None, f"no probe of {cluster}'s GPUs; --interference FILE takes one, e.g. from "
                                           "scripts/gpu_check.sh on such a GPU")
    term = probes.pick(found, backend, device, model=model)
    if term is None:
        return comm, probes.describe(None, "no interference probe among the --allreduce or --profile records; "
                                           "`ddpbench profile` and `advise` measure one")
    return dataclasses.replace(comm, interference=term), probes.describe(term, "")


def predict_rows(profile: Profile, comm: CommModel, plans: list[Schedule], other: float | None = None) -> list[dict]:
    """One row per schedule: the prediction in milliseconds, its interval from the model's validation
    errors (None where it was never validated; see uncertainty.py), the largest bucket's bytes, and its
    breakdown. `other`: seconds per iteration that are neither compute DDP overlaps nor communication (a
    trace's data loading and the user's own work); added as it is, since DDP neither hides nor lengthens it."""
    error = model_error(comm)
    rows = []
    for plan in plans:
        prediction = simulate(profile, comm, plan)
        extra = {} if other is None else {"other_ms": other * 1e3}
        latency = prediction.latency + (other or 0.0)
        interval = error.interval(latency) if error else None
        rows.append({**dataclasses.asdict(plan), "latency_ms": latency * 1e3,
                     "interval_ms": [interval[0] * 1e3, interval[1] * 1e3] if interval else None,
                     "largest_bucket_bytes": max((b["bytes"] for b in prediction.buckets), default=0),
                     **{f"{k}_ms": v * 1e3 for k, v in prediction.breakdown.items()}, **extra,
                     "interference_ms": prediction.interference * 1e3, "buckets": len(prediction.buckets)})
    return rows


TOLERANCE = 0.01  # predictions closer than this are ties: the model is not that exact


def near_best(rows: list[dict], tolerance: float = TOLERANCE) -> list[dict]:
    """The rows whose predicted latency is within `tolerance` of the smallest, by cap."""
    best = min(row["latency_ms"] for row in rows)
    return sorted((row for row in rows if row["latency_ms"] <= best * (1 + tolerance)), key=lambda row: row["bucket_mb"])


def recommend(rows: list[dict], tolerance: float = TOLERANCE) -> dict:
    """The best cap: the smallest predicted latency, preferring the smaller cap within `tolerance`
    (a smaller cap starts communication earlier and needs less memory for the same speed)."""
    return near_best(rows, tolerance)[0]


def caps_text(near: list[float], caps: list[float]) -> str:
    """The near-best caps as text: a range `X-Y MB` where they are neighbours among `caps`, else a list."""
    caps = sorted(set(caps))
    first, last = caps.index(near[0]), caps.index(near[-1])
    if caps[first:last + 1] == near:
        return f"{near[0]:g}-{near[-1]:g} MB"
    return ", ".join(f"{cap:g}" for cap in near) + " MB"


def describe_profile(profile: Profile, source: Path, compute_s: float | None) -> str:
    """Which profile a prediction rests on: model, device, inputs, threads, co-located copies, file."""
    c = profile.config
    copies = "alone (1 copy)" if c["world_size"] == 1 else f"as {c['world_size']} co-located copies"
    scaled = f", scaled to {compute_s:g} s of compute per iteration (--compute-s)" if compute_s else ""
    if profile.scaled_to:
        scaled += (f", scaled to {profile.scaled_to['device']} at inputs {profile.scaled_to['inputs']} "
                   f"({profile.scaled_to['compute_s'] * 1e3:.1f} ms per iteration)")
    return (f"profile: {c['model']} on {c['device']}, batch {c['batch_size']}, image size {c['image_size']}, "
            f"sequence length {c['seq_len']}, {c['threads']} thread(s), measured {copies}{scaled}; from {source}")


def prediction_caveats(comm: CommModel, rows: list[dict]) -> list[str]:
    """Where the rows' intervals come from (or that there are none), and what they extrapolate."""
    error = model_error(comm)
    lines = [error.describe() if error else "intervals: none - this network (a cluster preset) was never validated "
             "against measured runs, so nothing bounds the model's error on it"]
    return lines + [f"warning: {w}" for w in extrapolation(comm, [r["world_size"] for r in rows],
                                                              max(r["largest_bucket_bytes"] for r in rows))]


def format_rows(rows: list[dict]) -> str:
    """A plain-text table of prediction rows, each with its interval (see prediction_caveats)."""
    header = (f"{'ranks':>6} {'cap MB':>7} {'overlap':>7} {'every':>5} {'groups':>6} {'buckets':>7} "
              f"{'latency ms':>10} {'90% of runs within':>19} {'fwd':>7} {'bwd':>7} {'comm':>7} {'tail':>6} {'opt':>6}")
    other = any("other_ms" in r for r in rows)  # a trace's data loading and the user's own work
    lines = [header + (f" {'other':>7}" if other else "")]
    for r in rows:
        lines.append(f"{r['world_size']:>6} {r['bucket_mb']:>7g} {'on' if r['overlap'] else 'off':>7} "
                     f"{r['sync_every']:>5} {r['process_groups']:>6} {r['buckets']:>7} {r['latency_ms']:>10.2f} "
                     + (f"{'[%.1f, %.1f]' % tuple(r['interval_ms']):>19} " if r["interval_ms"] else f"{'-':>19} ") +
                     f"{r['forward_ms']:>7.2f} {r['backward_ms']:>7.2f} {r['exposed_comm_ms']:>7.2f} "
                     f"{r['tail_ms']:>6.2f} {r['optimizer_ms']:>6.2f}" + (f" {r['other_ms']:>7.2f}" if other else ""))
    return "\n".join(lines)


def recommendation_line(rows: list[dict], near: list[float], error) -> str:
    """tune-bucket's verdict: the best cap, or where the default's prediction lies within the model's
    error of the best one's (error: uncertainty.ModelError or None), the default, saying so."""
    also = ""
    if len(near) > 1:
        also = (f" (any of {caps_text(near, [row['bucket_mb'] for row in rows])} predicts within "
                f"{TOLERANCE:.0%} of the best; the smallest starts communicating earliest)")
    best = next(row for row in rows if row["bucket_mb"] == near[0])
    default = next((row for row in rows if row["bucket_mb"] == 25 and row["world_size"] == best["world_size"]), None)
    if default is not None and 25 not in near:
        change = best["latency_ms"] / default["latency_ms"] - 1
        if within_error(error, change):
            return (f"keep --bucket-mb 25 (the default): the best cap, {near[0]:g} MB, predicts {change:+.1%}, within "
                    f"the model's error (median |error| {error.median_abs:.1%})")
    return f"recommended --bucket-mb {near[0]:g}{also}"
