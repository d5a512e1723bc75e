"""Which profile a prediction reads: the newest matching profile record, or a trace of the user's own loop,
scaled to another device's compute where asked (`predict`, `tune-bucket` and `advise` share these)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from experiments.args import check_positive
from experiments.core.config import ConfigError
from experiments.core.profile import Profile, config_value
from experiments.core.records import read_records

# The options that pick one profile among the records (with a trace, the trace is the one profile).
PICKS = ("model_config", "amp", "batch_size", "image_size", "seq_len", "threads", "colocated")


def chosen_profile(options) -> Profile:
    """The newest profile of --model measured as --colocated copies (narrowed by any input options given);
    `options`: predict's or tune-bucket's (predict_command.PredictOptions: this module is below it)."""
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
