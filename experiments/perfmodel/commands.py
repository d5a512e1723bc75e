"""The command line of `ddpbench profile | predict | tune-bucket` (the library: predict.py; scale-profile:
scale_command.py).

    ddpbench profile --model resnet50,bert-base --image-size 32 --seq-len 16 --batch-size 2 --out P.jsonl
    ddpbench profile --model resnet50 --colocated 1,2 --out P.jsonl    # also as 2 ranks sharing this host
    ddpbench predict --profile P.jsonl --model resnet50 --cluster paper-v100-nccl --world-size 8,32,256
    ddpbench predict --profile P.jsonl --model resnet50 --allreduce results/runs/<machine> --world-size 2
    ddpbench tune-bucket --profile P.jsonl --model bert-base --cluster paper-v100-nccl --world-size 32
    ddpbench tune-bucket --profile P.jsonl --model resnet50 --allreduce results/runs/<machine> --link 2.5gbit
    ddpbench predict --trace my_loop.json --allreduce results/runs/<machine> --world-size 2   # docs/trace.md
    ddpbench tune-bucket --trace my_loop.json --cluster paper-v100-nccl --world-size 32
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from experiments.args import check_at_least, check_positive
from experiments.core.config import (
    ConfigError,
    RunConfig,
    default_backend_and_device,
    parse_ints,
    parse_list,
    validate_backend,
)
from experiments.core.profile import Profile, config_value
from experiments.core.records import read_records
from experiments.measure.configs import expand_grid, grid_values
from experiments.perfmodel.comm import CLUSTERS
from experiments.perfmodel.devices import device_warnings
from experiments.perfmodel.predict import (
    DEFAULT_CAPS,
    TOLERANCE,
    caps_text,
    comm_model,
    describe_profile,
    format_rows,
    near_best,
    predict_rows,
    prediction_caveats,
    with_interference,
)
from experiments.perfmodel.uncertainty import model_error, within_error
from experiments.perfmodel.simulate import Schedule

# The RunConfig fields `ddpbench profile` takes (model_config: ';' between configurations, as in `run`).
PROFILED = ("model", "batch_size", "image_size", "seq_len", "threads", "iters", "warmup", "device", "model_config", "amp")


@dataclass(frozen=True)
class ProfileOptions:
    """What `ddpbench profile` profiles and where its records go (its flags, typed). A list option takes its
    comma-separated text (model_config: ';' between configurations) or the values themselves; None: RunConfig's
    default (device: the hardware's, threads: 1)."""

    out: Path
    model: str | list[str] | None = None
    batch_size: str | list[int] | None = None
    image_size: str | list[int] | None = None
    seq_len: str | list[int] | None = None
    threads: str | list[int] | None = None
    iters: str | list[int] | None = None
    warmup: str | list[int] | None = None
    device: str | list[str] | None = None
    model_config: str | list[str] | None = None
    amp: str | list[str] | None = None
    colocated: str | list[int] = "1"
    interference_probe: str = "on"
    resume: bool = False
    timeout: float = 600.0


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """`ddpbench profile`: what to profile (one process, world size 1)."""
    for name in PROFILED:
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, metavar="LIST",
                            help="key=value,... for --model; several configurations separated by ';'"
                            if name == "model_config" else f"comma-separated; default {getattr(RunConfig(), name)!r}")
    parser.add_argument("--colocated", default="1", metavar="LIST",
                        help="comma-separated; profile N independent copies at once, as N ranks sharing this host "
                        "compute (default 1: one process alone)")
    parser.add_argument("--interference-probe", default="on", metavar="on|off",
                        help="after the profiles, probe each model's interference (its backward alone and beside an "
                        "all-reduce of its gradient bytes, and on a CPU DDP's backward with overlap and without; 2 "
                        "ranks; seconds) into --out (default on)")


def profile(options: ProfileOptions) -> int:
    """`ddpbench profile`: profile every config not yet recorded in --out, then probe (see command.measure_jobs)."""
    from experiments.measure.command import measure_jobs

    return measure_jobs("profile", options.out, options.resume, options.timeout, lambda: resolve(options),
                        lambda configs: run(configs, options))


def resolve(options: ProfileOptions) -> list[RunConfig]:
    """The configs to profile (world size = co-located copies, each a world of one), validated."""
    from experiments.perfmodel.profiler import profile_config  # imports torch: not to parse the options

    _, default_device = default_backend_and_device()
    lists = {name: grid_values(name, getattr(options, name)) for name in PROFILED if getattr(options, name) is not None}
    lists.setdefault("device", [default_device])
    lists.setdefault("threads", [1])  # as the main job's runs: one compute thread per rank
    colocated = parse_ints("colocated", options.colocated, 1)
    configs = [dataclasses.replace(profile_config(c, n), backend="nccl" if c.device == "cuda" else "gloo")
               for c in expand_grid({**lists, "world_size": [1]}) for n in colocated]
    for config in configs:  # co-located GPU copies need a GPU each
        validate_backend(config.backend, config.device, config.world_size)
    if options.interference_probe not in ("on", "off"):
        raise ConfigError(f"--interference-probe={options.interference_probe!r} is not allowed; choose on or off")
    return configs


def probes_of(configs: list[RunConfig]) -> list:
    """One interference probe per profiled model and inputs, with the ranks this host gives it."""
    from experiments.perfmodel.interference import probe_config, ranks_here

    return list(dict.fromkeys(probe_config(c, ranks_here(c.device)) for c in configs))


def run(configs: list[RunConfig], options: ProfileOptions) -> dict:
    """Profile every config not yet recorded (see sweep.run_jobs)."""
    from experiments.measure.sweep import run_jobs
    from experiments.perfmodel.profiler import make_record, measure

    counts = run_jobs(configs, options.out, measure, make_record, "profile", resume=options.resume,
                      timeout=options.timeout)
    if options.interference_probe == "on":
        from experiments.perfmodel.interference import run_probes

        probed = run_probes(probes_of(configs), options.out, resume=options.resume, timeout=options.timeout)
        counts = {key: counts[key] + probed[key] for key in counts}
    return counts


@dataclass(frozen=True)
class PredictOptions:
    """What `ddpbench predict` predicts, from which profile (or trace) and network (its flags, typed). The
    profile is picked by model_config .. colocated where given (None: the newest); the schedule lists take
    their comma-separated text."""

    profile: Path | None = None
    trace: Path | None = None
    model: str | None = None
    model_config: str | None = None
    amp: str | None = None
    batch_size: int | None = None
    image_size: int | None = None
    seq_len: int | None = None
    threads: int | None = None
    colocated: int | None = None
    compute_s: float | None = None
    cluster: str | None = None
    allreduce: Path | None = None
    link: str = "none"
    ranks_per_host: int = 1
    backend: str = "gloo"
    device: str = "cpu"
    interference: str | None = None
    world_size: str = "2"
    bucket_mb: str = "25"
    first_bucket_mb: float = 1.0
    sync_every: str = "1"
    process_groups: str = "1"
    overlap: str = "on"
    json: bool = False
    command: str = "predict"


@dataclass(frozen=True)
class TuneBucketOptions(PredictOptions):
    """What `ddpbench tune-bucket` tunes: predict's options, over the bucket caps to choose from."""

    bucket_mb: str = DEFAULT_CAPS
    command: str = "tune-bucket"


# The options that pick one profile among the records (with a trace, the trace is the one profile).
PICKS = ("model_config", "amp", "batch_size", "image_size", "seq_len", "threads", "colocated")


def add_model_arguments(parser: argparse.ArgumentParser, tune: bool) -> None:
    """Options shared by `predict` and `tune-bucket`."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile", type=Path, help="profile records (file or folder)")
    source.add_argument("--trace", type=Path, help="a torch.profiler trace (JSON, record_shapes=True) of your own "
                        "training loop, one process, a few iterations (docs/trace.md)")
    parser.add_argument("--model", help="with --profile: the profiled model to predict (its --model spec); "
                        "with --trace: a name for it (default: the file's name)")
    parser.add_argument("--model-config", dest="model_config",
                        help="pick the profile with this --model-config (default: the newest profile of the model)")
    parser.add_argument("--amp", help="pick the profile with this --amp (default: the newest profile of the model)")
    for name in ("batch_size", "image_size", "seq_len", "threads"):
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int,
                            help="pick the profile with this value (default: the newest profile of the model)")
    parser.add_argument("--colocated", type=int, default=None,
                        help="pick the profile measured as this many co-located copies (default: 1, a process alone, "
                        "or the only count the file has; on a shared host, the world size)")
    parser.add_argument("--compute-s", type=float, help="scale the profile so that one synchronised iteration computes "
                        "for this many seconds (e.g. a CPU profile used for a GPU cluster: the GPU's time)")
    network = parser.add_mutually_exclusive_group(required=True)
    network.add_argument("--cluster", help=f"a cluster preset: {', '.join(CLUSTERS)}")
    network.add_argument("--allreduce", type=Path, help="all-reduce records to fit (file or folder) - this machine")
    parser.add_argument("--link", default="none", help="with --allreduce: predict for this machine's ranks on emulated "
                        "hosts behind links of this rate (as `ddpbench run --link`), e.g. 2.5gbit")
    parser.add_argument("--ranks-per-host", type=int, default=1, help="with --link: ranks per emulated host")
    parser.add_argument("--backend", default="gloo", help="with --allreduce: the backend whose records to fit")
    parser.add_argument("--device", default="cpu", help="with --allreduce: the device whose records to fit")
    parser.add_argument("--interference", metavar="FILE|none", help="records holding an interference probe (compute "
                        "slowed beside communication; for --cluster, a GPU's, e.g. from scripts/gpu_check.sh), or none "
                        "(default: the newest probe among the --allreduce and --profile records; none for --cluster)")
    parser.add_argument("--world-size", default="2", help="comma-separated rank counts")
    parser.add_argument("--bucket-mb", default=DEFAULT_CAPS if tune else "25", help="comma-separated caps (MB)")
    parser.add_argument("--first-bucket-mb", type=float, default=1.0)
    parser.add_argument("--sync-every", default="1", help="comma-separated n (reduce every n iterations)")
    parser.add_argument("--process-groups", default="1", help="comma-separated round-robin group counts")
    parser.add_argument("--overlap", default="on", help="on, off, or on,off")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def chosen_profile(options: PredictOptions) -> Profile:
    """The newest profile of --model measured as --colocated copies (narrowed by any input options given)."""
    if options.model is None:
        raise ConfigError("--model is required with --profile (the profiled model to predict)")
    try:
        records = read_records(options.profile)
    except FileNotFoundError as error:
        raise ConfigError(f"--profile: {error}") from None
    flags = {k: getattr(options, k) for k in ("batch_size", "image_size", "seq_len", "threads", "colocated",
                                           "model_config", "amp") if getattr(options, k, None) is not None}
    if "colocated" not in flags:
        # One copy (a process alone) by default; where the file holds profiles of one other copy count only
        # (`advise` profiles as many copies as ranks), that one: it is the only profile there is.
        counts = {r["config"]["world_size"] for r in records if r.get("kind") == "profile" and r["status"] == "ok"
                  and r["config"]["model"] == options.model}
        flags["colocated"] = 1 if 1 in counts or len(counts) != 1 else counts.pop()
    # a profile's world size is its count of co-located copies
    wanted = {("world_size" if k == "colocated" else k): v for k, v in flags.items()}
    matches = [r for r in records if r.get("kind") == "profile" and r["status"] == "ok"
               and r["config"]["model"] == options.model
               and all(config_value(r["config"], k) == v for k, v in wanted.items())]
    if not matches:
        found = sorted({f"{r['config']['model']} (colocated {r['config']['world_size']})"
                        for r in records if r.get("kind") == "profile"})
        asked = ", ".join(f"--{k.replace('_', '-')}={v}" for k, v in flags.items())
        counts = sorted({r["config"]["world_size"] for r in records if r.get("kind") == "profile"
                         and r["config"]["model"] == options.model})
        hint = (f"; add --colocated {counts[0]}" if len(counts) == 1 else
                f"; add --colocated with one of {', '.join(map(str, counts))}") if counts else ""
        raise ConfigError(f"--profile={str(options.profile)!r} holds no profile of --model={options.model!r} with "
                          f"{asked}; "
                          f"it has: {', '.join(found) or 'none'}{hint} (make one with `ddpbench profile`)")
    return scaled_to_compute(Profile.from_record(matches[-1]), options.compute_s)


def scaled_to_compute(profile: Profile, compute_s: float | None) -> Profile:
    """`profile` scaled so that one synchronised iteration computes for `compute_s` seconds (if given)."""
    if compute_s is None:
        return profile
    check_positive("compute-s", compute_s)
    return profile.scaled(compute_s / profile.compute)


def traced_profile(path: Path, model: str | None, compute_s: float | None, picks: dict):
    """The trace at `path` read as a profile of `model`, scaled by --compute-s: compute (earlier micro-batches
    too) scales, `other` (data loading, the user's own work) stays as traced - another device does not change
    it. `picks`: the PICKS options given, which a trace refuses (ConfigError)."""
    from experiments.perfmodel.trace import read_trace

    picked = [f"--{k.replace('_', '-')}" for k in PICKS if picks.get(k) is not None]
    if picked:
        raise ConfigError(f"{', '.join(picked)} pick among profile records; with --trace the trace is the one profile "
                          "(drop them, or trace your loop with the inputs you want)")
    trace = read_trace(path, model)
    if compute_s is not None:
        scaled = scaled_to_compute(trace.profile, compute_s)
        factor = scaled.compute / trace.profile.compute
        trace = dataclasses.replace(trace, profile=scaled, accumulate=trace.accumulate * factor)
    return trace


def schedules(options: PredictOptions) -> list[Schedule]:
    """Every combination of the schedule lists, validated."""
    overlaps = []
    for item in options.overlap.split(","):
        if item.strip() not in ("on", "off"):
            raise ConfigError(f"--overlap: {item.strip()!r} is not allowed; choose on, off, or on,off")
        overlaps.append(item.strip() == "on")
    caps = parse_list("bucket_mb", options.bucket_mb)
    if any(cap < 0 for cap in caps):
        raise ConfigError(f"--bucket-mb={options.bucket_mb} is not allowed; caps must be >= 0")
    check_at_least("first-bucket-mb", options.first_bucket_mb, 0)
    return [Schedule(world_size=p, bucket_mb=cap, first_bucket_mb=options.first_bucket_mb, overlap=overlap,
                     sync_every=n, process_groups=k)
            for p, cap, n, k, overlap in itertools.product(
                parse_ints("world-size", options.world_size, 1), caps, parse_ints("sync-every", options.sync_every, 1),
                parse_ints("process-groups", options.process_groups, 1), overlaps)]


def main(options: PredictOptions) -> int:
    """`predict` and `tune-bucket`: print predictions (and the recommended cap); 2 on bad input."""
    import sys

    trace = None
    try:
        comm = comm_model(options.cluster, options.allreduce, options.link, options.ranks_per_host, options.backend,
                          options.device)
        if options.trace is not None:
            trace = traced_profile(options.trace, options.model, options.compute_s,
                                   {k: getattr(options, k) for k in PICKS})
            profile = trace.profile
        else:
            profile = chosen_profile(options)
        comm, interference_line = with_interference(comm, options.cluster, options.interference, _found(options),
                                                    options.backend, options.device, profile.model)
        plans = schedules(options)
        if options.command == "tune-bucket" and len({(s.world_size, s.sync_every, s.process_groups, s.overlap)
                                                 for s in plans}) > 1:
            raise ConfigError("tune-bucket takes one value each of --world-size, --sync-every, --process-groups "
                              "and --overlap; it varies --bucket-mb")
    except ConfigError as error:
        print(f"ddpbench {options.command}: error: {error}", file=sys.stderr)
        return 2
    # Up front, before any figure: a prediction read before its caveat misleads.
    warnings = device_warnings(profile, comm, options.cluster, options.device, options.compute_s)
    if trace is not None:
        warnings += trace.warnings
    for warning in warnings:
        print(f"ddpbench {options.command}: warning: {warning}", file=sys.stderr, flush=True)
    rows = predict_rows(profile, comm, plans, None if trace is None else trace.other + trace.accumulate)
    result = {"model": profile.model, "profile": profile.config, "network": comm.name, "source": comm.source,
              "warnings": warnings, "interference": dataclasses.asdict(comm.interference) if comm.interference else None,
              "interference_line": interference_line, "predictions": rows}
    result["caveats"] = prediction_caveats(comm, rows)
    if options.command == "tune-bucket":
        near = [row["bucket_mb"] for row in near_best(rows)]
        result["recommended_bucket_mb"] = near[0]
        result["near_best_bucket_mb"] = near
        result["recommendation"] = recommendation_line(rows, near, model_error(comm))
    if trace is not None:
        result["trace"] = trace_summary(trace, comm, plans, result.get("recommended_bucket_mb"))
    if options.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{profile.model} on {comm.name} (model prediction; {comm.source})")
    if trace is not None:
        from experiments.perfmodel.trace import describe

        print(describe(trace, options.trace))
    else:
        print(describe_profile(profile, options.profile, options.compute_s))
    print(interference_line)
    print(format_rows(rows))
    print("\n".join(result["caveats"]))
    if trace is not None:
        for shown in result["trace"]["buckets"]:
            print(f"buckets at {shown['world_size']} ranks, cap {shown['bucket_mb']:g} MB "
                  f"(overlap {'on' if shown['overlap'] else 'off'}):")
            print("\n".join(shown["lines"]))
    if options.command == "tune-bucket":
        print(result["recommendation"])
    return 0


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


def _found(options: PredictOptions) -> list[dict]:
    """The records a probe may come from: --allreduce's and --profile's (none with --cluster)."""
    if options.cluster is not None:
        return []
    paths = [options.allreduce] + ([options.profile] if getattr(options, "profile", None) is not None else [])
    return [r for path in paths for r in read_records(path) if r.get("kind") == "interference"]


def trace_summary(trace, comm, plans: list[Schedule], recommended: float | None) -> dict:
    """The trace's phases and, per distinct schedule shown (tune-bucket: the recommended cap), each bucket
    and the gradient it waits for."""
    from experiments.perfmodel.simulate import buckets_of, simulate
    from experiments.perfmodel.trace import bucket_lines

    shown = [s for s in plans if recommended is None or s.bucket_mb == recommended][:4]  # a few, not a wall of text
    buckets = []
    for plan in shown:
        prediction = simulate(trace.profile, comm, plan)
        groups = buckets_of(trace.profile, plan.bucket_mb, plan.first_bucket_mb)
        buckets.append({"world_size": plan.world_size, "bucket_mb": plan.bucket_mb, "overlap": plan.overlap,
                        "lines": bucket_lines(trace, prediction.buckets, groups),
                        "waits_for": [max(g, key=trace.profile.ready.__getitem__) for g in groups]})
    return {"steps": trace.steps, "device": trace.device, "iteration_ms": trace.iteration * 1e3,
            "other_ms": trace.other * 1e3, "data_ms": trace.data * 1e3, "accumulate_ms": trace.accumulate * 1e3,
            "gradients": [{"shape": list(g.shape), "dtype": g.dtype, "bytes": g.nbytes} for g in trace.gradients],
            "warnings": trace.warnings, "buckets": buckets}
