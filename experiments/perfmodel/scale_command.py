"""The command line of `ddpbench scale-profile`: a profile of this machine scaled to a GPU's estimated
compute time (gpus.py), or a trace of the user's own loop read as a profile (trace_record.py); either is
the scale model's `--compute-profile`.

    ddpbench scale-profile --profile P.jsonl --model resnet50,bert-base --gpu v100 --out V100.jsonl
    ddpbench scale-profile --trace my_loop.json --model torchvision:resnet18 --out mine.profile.jsonl
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from experiments.args import check_positive
from experiments.core.config import ConfigError
from experiments.core.records import read_records
from experiments.measure.configs import grid_values
from experiments.perfmodel.gpus import PAPER_INPUTS, PEAK_FP32_FLOPS, estimate_inputs, scale_profile_record


@dataclass(frozen=True)
class ScaleProfileOptions:
    """What `ddpbench scale-profile` scales (a profile file, or a trace), to which GPU, and where the records go
    (its flags, typed; model: comma-separated text or the names themselves)."""

    model: str | list[str]
    out: Path
    profile: Path | None = None
    trace: Path | None = None
    model_config: str = ""
    gpu: str | None = None
    batch_size: int | None = None
    image_size: int | None = None
    seq_len: int | None = None
    colocated: int = 1
    resume: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`ddpbench scale-profile`: a profile of this machine scaled to a GPU's estimated compute time, or a
    trace of the user's own loop read as a profile (the scale model's `--compute-profile`)."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile", type=Path, help="profile records (file or folder)")
    source.add_argument("--trace", type=Path, help="a torch.profiler trace of your own loop (docs/trace.md), read as a "
                        "profile of --model (its gradients matched to the model's parameters by shape)")
    parser.add_argument("--model", required=True,
                        help="comma-separated --model names of `run` (built-in, torchvision:, transformers:, a file), "
                             "each with a profile in --profile; its training FLOPs are counted at the inputs below; "
                             "with --trace: the one model the trace is of")
    parser.add_argument("--model-config", default="", help="with --trace: the model's --model-config, as in `run`")
    parser.add_argument("--gpu", help=f"one of {', '.join(PEAK_FP32_FLOPS)} (required with --profile; with --trace, "
                        "optional: without it the trace's own times)")
    papers = "; ".join(f"{m} {', '.join(f'{k}={v}' for k, v in i.items())}" for m, i in PAPER_INPUTS.items())
    for name in ("batch_size", "image_size", "seq_len"):
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, metavar="N",
                            help=f"the {name.replace('_', ' ')} the GPU estimate is for (default: the paper's for "
                                 f"its models - {papers} - else the profile's); with --trace: the traced one")
    parser.add_argument("--colocated", type=int, default=1, help="scale the profile measured as this many copies; "
                        "with --trace: the trace was made as one of this many copies training at once")
    parser.add_argument("--out", type=Path, required=True, help="record file the scaled profiles are appended to")
    parser.add_argument("--resume", action="store_true", help="skip models already scaled to --gpu in --out")


def main(options: ScaleProfileOptions) -> int:
    """Append each model's newest profile, scaled to --gpu, to --out (or the trace's profile); 2 on bad input."""
    import sys

    from experiments.core.records import append_record

    try:
        if options.gpu is not None and options.gpu not in PEAK_FP32_FLOPS:
            raise ConfigError(f"--gpu={options.gpu!r} is not allowed; choose one of {', '.join(PEAK_FP32_FLOPS)}")
        for name in ("batch_size", "image_size", "seq_len", "colocated"):
            if getattr(options, name) is not None:
                check_positive(name.replace("_", "-"), getattr(options, name))
        asked = {name: getattr(options, name) for name in ("batch_size", "image_size", "seq_len")}
        scaled = [_traced_record(options, asked)] if options.trace is not None else _scaled_records(options, asked)
    except FileNotFoundError as error:
        print(f"ddpbench scale-profile: error: --{'trace' if options.trace else 'profile'}: {error}", file=sys.stderr)
        return 2
    except ValueError as error:  # ConfigError, or an unknown gpu / model without an estimate
        print(f"ddpbench scale-profile: error: {error}", file=sys.stderr)
        return 2
    options.out.parent.mkdir(parents=True, exist_ok=True)
    for record in scaled:
        append_record(options.out, record)
        s = record.get("scaled_to")
        if s is None:
            print(f"{record['config']['model']}: {record['summary']['p50'] * 1e3:.3g} ms of compute per iteration as "
                  f"traced ({len(record['synced'])} iterations of {options.trace}) -> {options.out}")
            continue
        print(f"{record['config']['model']}: {s['compute_s'] * 1e3:.3g} ms of compute per iteration on {s['device']} "
              f"(x{s['factor']:.3g} the measured profile; {s['basis']}) -> {options.out}")
    return 0


def _scaled_records(options: ScaleProfileOptions, asked: dict) -> list[dict]:
    """Each --model's newest measured profile in --profile (as --colocated copies), scaled to --gpu."""
    if options.gpu is None:
        raise ConfigError(f"--gpu is required with --profile; choose one of {', '.join(PEAK_FP32_FLOPS)}")
    records = read_records(options.profile)
    done = {(r["config"]["model"], r["scaled_to"]["gpu"]) for r in read_records(options.out) if "scaled_to" in r} \
        if options.resume and options.out.exists() else set()
    scaled = []
    for model in grid_values("model", options.model):
        if (model, options.gpu) in done:
            continue
        mine = [r for r in records if r.get("kind") == "profile" and r["status"] == "ok" and "scaled_to" not in r
                and r["config"]["model"] == model and r["config"]["world_size"] == options.colocated]
        if not mine:
            raise ConfigError(f"--profile={str(options.profile)!r} holds no measured profile of --model={model!r} "
                              f"as --colocated={options.colocated} copies (make one with `ddpbench profile`)")
        scaled.append(scale_profile_record(mine[-1], options.gpu, estimate_inputs(mine[-1]["config"], **asked)))
    return scaled


def _traced_record(options: ScaleProfileOptions, asked: dict) -> dict:
    """The trace read as a profile record of --model (trace_record.py), scaled to --gpu where given."""
    from experiments.measure.workloads.spec import check
    from experiments.perfmodel.trace import read_trace
    from experiments.perfmodel.trace_record import profile_record, trace_config

    models = grid_values("model", options.model)
    if len(models) != 1:
        raise ConfigError(f"--model={options.model!r}: with --trace name the one model the trace is of")
    trace = read_trace(options.trace)
    config = trace_config(models[0], options.model_config, copies=options.colocated, device=trace.device, **asked)
    checked = check(config.model, config.model_config, config.image_size, config.seq_len)
    config = dataclasses.replace(config, model_hash=checked["source_hash"])
    record = profile_record(trace, options.trace, config)
    return record if options.gpu is None else scale_profile_record(record, options.gpu,
                                                                   estimate_inputs(record["config"],
                                                                                                  **asked))


