"""`ddpbench advise`: how DDP will behave for the user's model, from one profile of a few minutes.

    ddpbench advise --model torchvision:resnet18 --image-size 32 --world-size 2          # this machine
    ddpbench advise --model transformers:gpt2 --model-config n_layer=4 --cluster h100-400g-nccl \\
        --world-size 64 --compute-s 0.05 --out results/advise/gpt2

Measures, in one process (or as many co-located copies as ranks will share this host), the profile the
performance model starts from (`ddpbench profile`) and the probes of `probe.py`; then predicts, with
the model's own simulation (`simulate.py`) on the network asked for, the figures of `report.py`.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from experiments.args import check_positive, check_timeout
from experiments.core.config import ConfigError, RunConfig, default_backend_and_device, parse_list, validate_backend
from experiments.core.machine import machine_name
from experiments.core.records import read_records
from experiments.measure.configs import expand_grid
from experiments.perfmodel.comm import CLUSTERS, CommModel
from experiments.perfmodel.devices import Device, families, mismatch_warnings
from experiments.perfmodel.predict import comm_model
from experiments.perfmodel.report import build_report, format_markdown, format_terminal, write_outputs

# probe.py and profiler.py (the measuring, in the ranks) import torch: they are imported where used, so that
# the command line can import this module to parse its options without them.
SINGLE = ("model", "model_config", "amp", "batch_size", "image_size", "seq_len", "threads", "iters", "warmup",
          "device")


@dataclass(frozen=True)
class AdviseOptions:
    """What `ddpbench advise` profiles (or reads: trace, from_profile), the network it predicts for, and where
    it writes (its flags, typed; the profile's options as comma-free text, None: their defaults)."""

    model: str | None = None
    trace: Path | None = None
    model_config: str | None = None
    amp: str | None = None
    batch_size: str | None = None
    image_size: str | None = None
    seq_len: str | None = None
    iters: str | None = None
    warmup: str | None = None
    threads: str | None = None
    device: str | None = None
    world_size: int = 2
    cluster: str | None = None
    link: str = "none"
    ranks_per_host: int = 1
    allreduce: Path | None = None
    compute_s: float | None = None
    colocated: int | None = None
    out: Path | None = None
    from_profile: Path | None = None
    timeout: float = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`ddpbench advise`'s options."""
    defaults = RunConfig()
    parser.add_argument("--model", help="the model: a built-in name, torchvision:NAME, transformers:TYPE, "
                        "path/to/file.py or package.module (docs/your-model.md); with --trace, a name for it")
    parser.add_argument("--trace", type=Path, help="measure nothing: advise from a torch.profiler trace (JSON, "
                        "record_shapes=True) of your own training loop (docs/trace.md)")
    parser.add_argument("--model-config", dest="model_config", help="key=value,... for --model")
    parser.add_argument("--amp", help="none (default), bf16, fp16 (CUDA)")
    for name in ("batch_size", "image_size", "seq_len", "iters", "warmup"):
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name,
                            help=f"per rank / of the profile; default {getattr(defaults, name)}")
    parser.add_argument("--threads", help="compute threads of the profile; default: this host's cores shared by "
                        "the co-located copies")
    parser.add_argument("--device", help="the device profiled; default cuda with GPUs, else cpu")
    parser.add_argument("--world-size", type=int, default=2, help="ranks to predict for (default 2)")
    network = parser.add_mutually_exclusive_group()
    network.add_argument("--cluster", help=f"a cluster preset: {', '.join(CLUSTERS)} (default: this machine)")
    network.add_argument("--link", default="none", help="this machine's ranks on emulated hosts behind links of this "
                         "rate, as `ddpbench run --link` (default none: loopback)")
    parser.add_argument("--ranks-per-host", type=int, default=1, help="with --link: ranks per emulated host")
    parser.add_argument("--allreduce", type=Path, help="this machine's all-reduce records, to fit (default "
                        "results/runs/<this machine>); not needed with --cluster")
    parser.add_argument("--compute-s", type=float, help="scale the profile to this many seconds of compute per "
                        "iteration (a CPU profile used for a GPU cluster: the GPU's time)")
    parser.add_argument("--colocated", type=int, help="profile as this many copies at once (default: the world size "
                        "on this machine, 1 with --cluster)")
    parser.add_argument("--out", type=Path, help="write OUT.md, OUT.json and the profile record OUT.profile.jsonl")
    parser.add_argument("--from-profile", type=Path, metavar="FILE", help="measure nothing: report from the newest "
                        "advise profile of --model in FILE (an OUT.profile.jsonl), e.g. for another network")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds the measurement may take")


def resolve(options: AdviseOptions) -> RunConfig:
    """The profile's config, validated (ConfigError naming a bad value)."""
    from experiments.perfmodel import profiler as profiling

    _backend, device = default_backend_and_device()
    lists = {name: parse_list(name, getattr(options, name)) for name in SINGLE
             if getattr(options, name, None) is not None}
    for name, values in lists.items():
        if len(values) != 1:
            raise ConfigError(f"--{name.replace('_', '-')}: advise takes one value, got {len(values)}")
    if options.world_size < 1:
        raise ConfigError(f"--world-size={options.world_size} is not allowed; it must be >= 1")
    here = options.cluster is None  # the ranks will share this machine's cores
    copies = options.colocated or (options.world_size if here else 1)
    if copies < 1:
        raise ConfigError(f"--colocated={copies} is not allowed; it must be >= 1")
    lists.setdefault("device", [device])
    lists.setdefault("threads", [max(1, (os.cpu_count() or 1) // copies)])  # as `run` shares the cores
    (config,) = expand_grid({**lists, "world_size": [1]})
    config = dataclasses.replace(profiling.profile_config(config, copies),
                                 backend="nccl" if config.device == "cuda" else "gloo")
    validate_backend(config.backend, config.device, config.world_size)
    return config


def network(options: AdviseOptions, config: RunConfig) -> CommModel:
    """The network advise predicts for: --cluster, or this machine's all-reduce records (--allreduce,
    default results/runs/<machine>) of the config's backend and device, behind --link if given."""
    allreduce = options.allreduce or Path(__file__).resolve().parents[2] / "results" / "runs" / machine_name()
    if options.cluster is None and not allreduce.exists():
        raise ConfigError(f"--allreduce: no all-reduce records at {allreduce}; measure them with `ddpbench allreduce "
                          f"--mode size --world-size 2 --out {allreduce}/allreduce.jsonl`, or pass --cluster")
    return comm_model(options.cluster, allreduce, options.link, options.ranks_per_host, config.backend, config.device)


def measure(rank: int, world_size: int, config_fields: dict) -> dict:
    """On each copy: the probes, then (for a model every parameter of which gets a gradient) the profile."""
    from experiments.perfmodel import probe
    from experiments.perfmodel import profiler as profiling

    probes = probe.measure(rank, world_size, config_fields)
    if probes["unused"]:
        return {"probes": probes}
    return {"probes": probes, **profiling.measure(rank, world_size, config_fields)}


def make_record(config: RunConfig, per_rank: list[dict], wall_s: float) -> dict:
    """A profile record (see profile.make_record) with the slowest copy's probes under `probes`."""
    from experiments.perfmodel import profiler as profiling

    probes = [r.pop("probes") for r in per_rank]
    if probes[0]["unused"]:
        names = probes[0]["unused"]
        return {"kind": "profile", "status": "failed", "config": dataclasses.asdict(config), "probes": probes[0],
                "error": f"{len(names)} parameter(s) get no gradient ({', '.join(names[:5])}"
                         f"{' ...' if len(names) > 5 else ''}): the model needs DDP's find_unused_parameters "
                         "(`ddpbench run --find-unused-parameters true`), which the profile does not use; no "
                         "timing profile"}
    record = profiling.make_record(config, per_rank, wall_s)
    record["probes"] = probes[record["slowest_copy"]]
    return record


def main(options: AdviseOptions) -> int:
    """Profile, predict, print the report (and write it with --out); 2 on bad input, 1 if measuring failed."""
    from experiments.args import check_output
    from experiments.measure.sweep import run_jobs

    if options.trace is not None:
        return _trace(options)
    try:
        if options.model is None:
            raise ConfigError("--model is required (the model to profile), or --trace (a trace of your own loop)")
        config = resolve(options)
        comm = network(options, config)
        if options.out is not None:
            for suffix in (".md", ".json", ".profile.jsonl"):
                check_output(options.out.with_name(options.out.name + suffix))
        if options.compute_s is not None:
            check_positive("compute-s", options.compute_s)
        check_timeout("timeout", options.timeout)
        stored = _stored(options.from_profile, options.model) if options.from_profile is not None else None
    except ConfigError as error:
        print(f"ddpbench advise: error: {error}", file=sys.stderr)
        return 2
    if stored is not None:
        found = read_records(options.from_profile)
        return _report(stored, *_interference(comm, options, found, config), options, options.from_profile)
    # Up front, before minutes of measuring: a profile of this device for another device's network.
    for warning in mismatch_warnings(this_device(config.device), "profile", comm, options.cluster, config.device,
                                     options.compute_s):
        print(f"ddpbench advise: warning: {warning}", file=sys.stderr, flush=True)
    kept: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:
        records = (options.out.with_name(options.out.name + ".profile.jsonl") if options.out is not None
                   else Path(scratch) / "profile.jsonl")
        if options.out is not None:
            records.parent.mkdir(parents=True, exist_ok=True)
        print(f"ddpbench advise: profiling {config.model} ({config.world_size} co-located "
              f"cop{'y' if config.world_size == 1 else 'ies'}, {config.warmup} + {config.iters} iterations each "
              "way, plus the probes) ...", file=sys.stderr)
        counts = run_jobs([config], records, measure, make_record, "profile", timeout=options.timeout,
                          on_record=lambda job, record, per_rank: kept.append(record),
                          echo=lambda line: print(line, file=sys.stderr))
        if options.cluster is None and options.world_size > 1 and kept and kept[0]["status"] == "ok":
            # The ranks will share this host: how much their backward slows while Gloo reduces beside it.
            from experiments.perfmodel import interference

            probe = interference.probe_config(config, max(2, config.world_size))
            print(f"ddpbench advise: probing interference ({probe.world_size} ranks: backward alone and beside an "
                  "all-reduce of the gradient bytes; on a CPU, DDP's backward with overlap and without) ...",
                  file=sys.stderr)
            run_jobs([probe], records, interference.measure, interference.make_record, "interference",
                     timeout=options.timeout, on_record=lambda job, record, per_rank: kept.append(record),
                     echo=lambda line: print(line, file=sys.stderr))
    if counts["failed"] and not (kept and "probes" in kept[0]):
        return 1  # the ranks' error is printed above
    return _report(kept[0], *_interference(comm, options, kept, config), options,
                   records if options.out is not None else None)


def _interference(comm: CommModel, options: AdviseOptions, found: list[dict], config: RunConfig):
    """`comm` with the interference term of `config`'s model among `found` (the probe advise just ran, or
    the --from-profile file's), else the fit's (results/runs), and the line that says which or why none."""
    from experiments.perfmodel import interference

    if options.cluster is not None:
        return (dataclasses.replace(comm, interference=None),
                interference.describe(None, f"the probe measures this machine, not {options.cluster}'s GPUs"))
    if options.world_size == 1:
        return comm, interference.describe(None, "one rank reduces nothing")
    term = interference.pick(found, config.backend, config.device, model=config.model) or comm.interference
    why = "no interference probe in the profile file or with this machine's all-reduce records"
    return dataclasses.replace(comm, interference=term), interference.describe(term, why)


# Options that say what advise measures; a trace is measured already.
MEASURING = ("model_config", "amp", "batch_size", "image_size", "seq_len", "threads", "iters", "warmup", "device",
             "colocated", "from_profile")


def _trace(options: AdviseOptions) -> int:
    """`advise --trace`: the report from a trace of the user's own loop; nothing is measured."""
    from experiments.perfmodel.profile_choice import PICKS, traced_profile
    from experiments.perfmodel.report import build_trace_report

    try:
        given = [f"--{name.replace('_', '-')}" for name in MEASURING if getattr(options, name, None) is not None]
        if given:
            raise ConfigError(f"{', '.join(given)} {'say' if len(given) > 1 else 'says'} what advise measures; with "
                              "--trace nothing is measured "
                              "(drop them, or trace your loop with the inputs you want)")
        if options.world_size < 1:
            raise ConfigError(f"--world-size={options.world_size} is not allowed; it must be >= 1")
        if options.compute_s is not None:
            check_positive("compute-s", options.compute_s)
        if options.out is not None:
            from experiments.args import check_output

            for suffix in (".md", ".json"):
                check_output(options.out.with_name(options.out.name + suffix))
        trace = traced_profile(options.trace, options.model, options.compute_s,
                               {k: getattr(options, k) for k in PICKS})
        device = trace.profile.config["device"]
        traced = RunConfig(model=trace.profile.model, backend="nccl" if device == "cuda" else "gloo", device=device)
        comm, interference_line = _interference(network(options, traced), options, [], traced)
    except ConfigError as error:
        print(f"ddpbench advise: error: {error}", file=sys.stderr)
        return 2
    return _show(build_trace_report(trace, comm, options.world_size, options.cluster, options.compute_s, options.trace),
                 interference_line, options)


def this_device(device: str) -> Device:
    """The device `advise` is about to profile on: this machine's GPU (device cuda) or its CPU."""
    if device == "cuda":
        import torch

        name = torch.cuda.get_device_name(0)
        return Device("gpu", name, families(name))
    return Device("cpu", "this CPU")


def _stored(path: Path, model: str) -> dict:
    """The newest advise record of `model` in `path` (ConfigError if there is none)."""
    try:
        found = [r for r in read_records(path) if "probes" in r and r["config"]["model"] == model]
    except FileNotFoundError as error:
        raise ConfigError(f"--from-profile: {error}") from None
    if not found:
        raise ConfigError(f"--from-profile={str(path)!r} holds no advise profile of --model={model!r}")
    return found[-1]


def _report(record: dict, comm, interference_line: str, options: AdviseOptions, profile_path: Path | None) -> int:
    return _show(build_report(record, comm, options.world_size, options.cluster, options.compute_s, profile_path),
                 interference_line, options)


def _show(report: dict, interference_line: str, options: AdviseOptions) -> int:
    """Print the report (naming the interference term it used) and write it where --out says."""
    report["interference"] = interference_line
    print(format_terminal(report))
    if options.out is not None:
        write_outputs(report, options.out, format_markdown(report))
        print(f"ddpbench advise: wrote {options.out}.md and {options.out}.json", file=sys.stderr)
    return 0
