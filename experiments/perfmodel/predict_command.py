"""The command line of `ddpbench predict | tune-bucket` (the library: predict.py, simulate.py; which
profile: profile_choice.py).

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

from experiments.args import check_at_least
from experiments.core.config import ConfigError, parse_ints, parse_list
from experiments.core.records import read_records
from experiments.perfmodel.comm import CLUSTERS
from experiments.perfmodel.devices import device_warnings
from experiments.perfmodel.predict import (
    DEFAULT_CAPS,
    comm_model,
    describe_profile,
    format_rows,
    near_best,
    predict_rows,
    prediction_caveats,
    recommendation_line,
    with_interference,
)
from experiments.perfmodel.profile_choice import PICKS, chosen_profile, traced_profile
from experiments.perfmodel.simulate import Schedule
from experiments.perfmodel.uncertainty import model_error

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


def add_arguments(parser: argparse.ArgumentParser, tune: bool) -> None:
    """The flags of `predict` (tune=False) and `tune-bucket` (tune=True)."""
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
        from experiments.perfmodel.trace import trace_summary

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


def _found(options: PredictOptions) -> list[dict]:
    """The records a probe may come from: --allreduce's and --profile's (none with --cluster)."""
    if options.cluster is not None:
        return []
    paths = [options.allreduce] + ([options.profile] if getattr(options, "profile", None) is not None else [])
    return [r for path in paths for r in read_records(path) if r.get("kind") == "interference"]
