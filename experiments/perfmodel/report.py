"""The report of `ddpbench advise`: figures marked measured, counted or predicted; a terminal table,
Markdown and JSON.

Predictions come from the performance model (`simulate`) fed with the measured profile; where a
figure rests on a one-process measurement (bucket views, the graph search, the casts), that part is
measured and the combination predicted.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

from experiments.core.profile import Profile
from experiments.perfmodel.auto_choice import auto_bucket_shortlist
from experiments.perfmodel.comm import CommModel, Link
from experiments.perfmodel.devices import device_warnings
from experiments.perfmodel.predict import (
    DEFAULT_CAPS,
    TOLERANCE,
    caps_text,
    describe_profile,
    near_best,
    predict_rows,
)
from experiments.perfmodel.simulate import Schedule, simulate
from experiments.perfmodel.uncertainty import extrapolation, format_interval, model_error, within_error

MB = 1024 * 1024
SHOWN_BUCKETS = 12  # a longer layout is summarised in the terminal (Markdown and JSON keep every bucket)


def compressed(comm: CommModel) -> CommModel:
    """`comm` carrying half the bytes (an fp16/bf16 compression hook): every bus bandwidth doubled."""
    def half(link: Link | None) -> Link | None:
        return None if link is None else Link(alpha=link.alpha, busbw=2 * link.busbw)

    return dataclasses.replace(comm, name=f"{comm.name}, 16-bit compression", intra=half(comm.intra),
                               inter=half(comm.inter), cpu=half(comm.cpu))


def bucket_layout(profile: Profile, names: list[str], order: list[int], cap_mb: float = 25.0) -> list[dict]:
    """Buckets of `cap_mb` over parameters taken in `order`: size, when their first and last gradient
    are ready (ms after backward starts), how long the bucket waits for its last one, and which it is."""
    # ddp_core's package imports torch (seconds); the command line imports this module only to parse options.
    from ddp_core.bucketing import TensorSpec, assign_buckets

    specs = [TensorSpec(n, dtype) for n, dtype in zip(profile.nbytes, profile.dtypes)]
    rows = []
    for index, members in enumerate(assign_buckets(specs, order, cap_mb, 1.0)):
        first = min(profile.ready[i] for i in members)
        last_index = max(members, key=profile.ready.__getitem__)
        rows.append({"bucket": index, "tensors": len(members), "MB": sum(profile.nbytes[i] for i in members) / MB,
                     "first_ready_ms": first * 1e3, "complete_ms": profile.ready[last_index] * 1e3,
                     "waits_ms": (profile.ready[last_index] - first) * 1e3,
                     "last_gradient": names[last_index] if last_index < len(names) else str(last_index)})
    return rows


def _figure(figures: list, what: str, value: str, kind: str, number: float | None = None) -> None:
    figures.append({"figure": what, "value": value, "kind": kind, "number": number})


# How each method of experiments/measure/memory.py counts, in the words of a figure.
MEMORY_COUNTED = {"cuda": "tensors (max_memory_allocated)",
                  "hwm": "the process's peak resident set, libraries included",
                  "ru_maxrss": "the process's peak resident set since it started"}


def _memory_figures(figures: list, record: dict, size: dict) -> None:
    """The profile's peak memory (a rank's, where the profile ran as the ranks will) and what
    gradient_as_bucket_view saves: one copy of the gradients, which otherwise sit beside the buckets."""
    memory = record.get("memory")
    if memory:
        _figure(figures, "peak memory of a rank (the profile's measured iterations)",
                f"{memory['peak_mb']:.0f} MB ({MEMORY_COUNTED.get(memory['method'], memory['method'])})",
                "measured", memory["peak_mb"])
    if size.get("gradient_bytes"):
        _figure(figures, "gradient_as_bucket_view memory", f"up to {size['gradient_bytes'] / MB:.1f} MB less: the "
                "gradients are views into the buckets, not a second copy beside them (at the peak of backward, "
                "and between iterations where gradients are kept)", "counted", -size["gradient_bytes"] / MB)


def build_report(record: dict, comm: CommModel, world_size: int, cluster: str | None, compute_s: float | None,
                 profile_path: Path | None) -> dict:
    """Every figure of the report, from the advise record (profile + probes) and the network, for
    `world_size` ranks (`cluster`: the preset predicted for, if any; `compute_s`: the profile scaled to it)."""
    from experiments.perfmodel.probe import medians  # imports torch: not when the command line parses options

    c = record["config"]
    probes = medians(record["probes"])
    size = record.get("model_size") or record["probes"].get("model_size") or {}
    figures: list[dict] = []
    report = {"model": c["model"], "model_config": c.get("model_config", ""), "amp": c.get("amp", "none"),
              "model_hash": c.get("model_hash", ""), "world_size": world_size, "network": comm.name,
              "network_source": comm.source, "figures": figures, "warnings": [], "profile_config": c,
              "profile_file": str(profile_path) if profile_path else None}
    _figure(figures, "parameters", f"{size.get('parameters', 0) / 1e6:.2f} M", "counted", size.get("parameters"))
    _figure(figures, "gradient bytes reduced per iteration", f"{size.get('gradient_bytes', 0) / MB:.1f} MB in "
            f"{size.get('gradient_tensors', 0)} tensors", "counted", size.get("gradient_bytes"))
    _memory_figures(figures, record, size)
    forward_plain, forward_search = probes["forward_plain_s"], probes["forward_search_s"]
    unused = probes["unused"]
    _figure(figures, "find_unused_parameters needed", f"yes: {len(unused)} parameter(s) get no gradient "
            f"({', '.join(unused[:3])}{' ...' if len(unused) > 3 else ''})" if unused else "no: every parameter gets a "
            "gradient", "measured", len(unused))
    _figure(figures, "find_unused_parameters cost (forward, one process)",
            f"{forward_plain * 1e3:.2f} -> {forward_search * 1e3:.2f} ms ({forward_search / forward_plain - 1:+.1%})",
            "measured", forward_search - forward_plain)
    if record["status"] != "ok":
        report["warnings"].append(record["error"])
        report["profile"] = "none: " + record["error"]
        return report

    profile = Profile.from_record(record)
    if compute_s:
        profile = profile.scaled(compute_s / profile.compute)
    report["profile"] = describe_profile(profile, profile_path or "(not kept: pass --out)", compute_s)
    report["warnings"] += device_warnings(profile, comm, cluster, record["config"]["device"], compute_s)
    iterations = [sum(row[k] for k in ("forward", "backward", "tail", "optimizer")) for row in record["synced"]]
    quartiles = statistics.quantiles(iterations, n=4) if len(iterations) > 1 else [iterations[0]] * 3
    _figure(figures, "compute per iteration, the profile (forward / backward / optimizer)",
            f"{profile.compute * 1e3:.1f} ms ({profile.forward * 1e3:.1f} / {profile.backward * 1e3:.1f} / "
            f"{profile.optimizer * 1e3:.1f}); interquartile {quartiles[0] * 1e3:.1f}-{quartiles[2] * 1e3:.1f} ms"
            + (" (scaled by --compute-s)" if compute_s else ""), "measured", profile.compute)

    casts = {dtype: probes[f"cast_{dtype}_s"] for dtype in ("float16", "bfloat16")}
    views = (probes["iteration_copies_s"], probes["iteration_views_s"]) if "iteration_views_s" in probes else None
    _predicted(report, profile, comm, world_size, record["names"], registration=True, casts=casts, views=views)
    return report


def build_trace_report(trace, comm: CommModel, world_size: int, cluster: str | None, compute_s: float | None,
                       trace_path: Path) -> dict:
    """Every figure `advise --trace` can give from a torch.profiler trace of the user's own loop: what the
    trace holds (no model to probe: the graph search, bucket views and the casts are not measured)."""
    from experiments.perfmodel.trace import describe

    profile = trace.profile
    figures: list[dict] = []
    report = {"model": profile.model, "model_config": "", "amp": "none", "model_hash": "",
              "world_size": world_size, "network": comm.name, "network_source": comm.source, "figures": figures,
              "warnings": device_warnings(profile, comm, cluster, profile.config["device"], compute_s)
              + trace.warnings, "profile_config": profile.config, "profile_file": str(trace_path),
              "profile": describe(trace, trace_path)}
    total = sum(g.nbytes for g in trace.gradients)
    _figure(figures, "gradient bytes reduced per iteration", f"{total / MB:.1f} MB in {len(trace.gradients)} tensors",
            "counted", total)
    _figure(figures, "compute per iteration, the trace (forward / backward / optimizer)",
            f"{profile.compute * 1e3:.1f} ms ({profile.forward * 1e3:.1f} / {profile.backward * 1e3:.1f} / "
            f"{profile.optimizer * 1e3:.1f})" + (" (scaled by --compute-s)" if compute_s else ""), "measured",
            profile.compute)
    other = trace.other + trace.accumulate
    _figure(figures, "other: data loading, your own work, earlier micro-batches (added as traced)",
            f"{other * 1e3:.1f} ms (data loading {trace.data * 1e3:.1f} ms)", "measured", other)
    _predicted(report, profile, comm, world_size, [g.describe() for g in trace.gradients], other=other)
    _figure(figures, "not from a trace: find_unused_parameters, gradient_as_bucket_view, the compression casts",
            "need the model itself: `ddpbench advise --model ...`", "n/a")
    return report


def _predicted(report: dict, profile: Profile, comm: CommModel, n: int, names: list[str], other: float = 0.0,
               registration: bool = False, casts: dict | None = None, views: tuple | None = None) -> None:
    """The predicted figures (iteration, exposed communication, scaling, buckets, the cap, the options) of
    `profile` at `n` ranks on `comm`, with `other` seconds per iteration added as they are. `names`: the
    gradients' names in the profile's order; `registration`: that order is the model's (a profile), so
    the first iteration's buckets can be shown; `casts`/`views`: the one-process measurements of advise."""
    figures = report["figures"]
    base = simulate(profile, comm, Schedule(world_size=n))
    latency = base.latency + other
    alone = simulate(profile, comm, Schedule(world_size=1)).latency + other
    error = model_error(comm)
    spread = (f" (90% of validation runs within {format_interval(error, latency)} ms)" if error
              else " (no interval: the model was never validated on this network)")
    _figure(figures, f"iteration at {n} ranks, 25 MB buckets", f"{latency * 1e3:.1f} ms{spread}", "predicted", latency)
    report["warnings"] += [w for w in extrapolation(comm, [n], max((b["bytes"] for b in base.buckets), default=0))
                           if w not in report["warnings"]]
    _figure(figures, "exposed communication (after backward)",
            f"{base.breakdown['exposed_comm'] * 1e3:.1f} ms ({base.breakdown['exposed_comm'] / latency:.0%} of "
            "the iteration)", "predicted", base.breakdown["exposed_comm"])
    _figure(figures, f"scaling efficiency at {n} ranks (one process's iteration / this one)",
            f"{alone / latency:.0%}", "predicted", alone / latency)

    arrival = sorted(range(len(profile.ready)), key=profile.ready.__getitem__)
    report["buckets"] = bucket_layout(profile, names, arrival)
    _figure(figures, "buckets at 25 MB (in gradient arrival order, as after the first iteration)",
            f"{len(report['buckets'])}; the longest wait for a last gradient {max(b['waits_ms'] for b in report['buckets']):.1f} ms",
            "measured")
    if registration:
        layout = bucket_layout(profile, names, list(reversed(range(len(profile.ready)))))
        report["buckets_registration_order"] = layout
        worst = max(layout, key=lambda b: b["waits_ms"])
        _figure(figures, "same cap in registration order (the first iteration, or rebuilding off)",
                f"{len(layout)} buckets; bucket {worst['bucket']} waits {worst['waits_ms']:.1f} ms for "
                f"{worst['last_gradient']}", "measured")

    caps = [float(cap) for cap in DEFAULT_CAPS.split(",")]
    rows = predict_rows(profile, comm, [Schedule(world_size=n, bucket_mb=cap) for cap in caps], other or None)
    near = near_best(rows)
    best = near[0]
    at25 = next(row for row in rows if row["bucket_mb"] == 25)
    within = f"caps {caps_text([r['bucket_mb'] for r in near], caps)} predict within {TOLERANCE:.0%} of the best"
    if any(r["bucket_mb"] == 25 for r in near):
        _figure(figures, "recommended bucket cap", f"25 MB, the default ({within})", "predicted", 25.0)
    elif within_error(error, best["latency_ms"] / at25["latency_ms"] - 1):
        _figure(figures, "recommended bucket cap", f"25 MB, the default: the best cap, {best['bucket_mb']:g} MB, "
                f"predicts {best['latency_ms'] / at25['latency_ms'] - 1:+.1%}, within the model's error (median "
                f"|error| {error.median_abs:.1%})", "predicted", 25.0)
    else:
        _figure(figures, "recommended bucket cap", f"{best['bucket_mb']:g} MB: {best['latency_ms']:.1f} ms against "
                f"{at25['latency_ms']:.1f} ms at 25 MB ({best['latency_ms'] / at25['latency_ms'] - 1:+.1%}; {within})",
                "predicted", best["bucket_mb"])
    report["caps"] = rows
    auto, tried = auto_bucket_shortlist(profile, comm, n)
    _figure(figures, "bucket_cap_mb='auto' (ddp_core) would try",
            f"{', '.join(f'{cap:.3g}/{first:.3g} MB' for cap, first in tried)} and keep the fastest measured; the "
            f"{auto.model} schedule model prefers {auto.cap_mb:.3g} MB, first bucket {auto.first_cap_mb:.3g} MB: "
            f"{auto.reason()}", "predicted", auto.cap_mb)

    def option(what: str, seconds: float, note: str = "") -> None:
        change = seconds / latency - 1
        verdict = "pays off" if change < -TOLERANCE else "costs time" if change > TOLERANCE else "no gain"
        if within_error(error, change):  # a change smaller than the model's error is no recommendation
            verdict = f"within the model's error (median |error| {error.median_abs:.1%})"
        _figure(figures, what, f"{verdict}: {seconds * 1e3:.1f} ms ({change:+.1%}){note}", "predicted", seconds)

    if views is not None:
        copies, with_views = views
        _figure(figures, "gradient_as_bucket_view, one process (iteration without -> with)",
                f"{copies * 1e3:.1f} -> {with_views * 1e3:.1f} ms", "measured", copies - with_views)
        option(f"with gradient_as_bucket_view at {n} ranks", latency - (copies - with_views))
    for dtype, hook in (("float16", "fp16"), ("bfloat16", "bf16")):
        half = simulate(profile, compressed(comm), Schedule(world_size=n)).latency + other
        if casts is None:
            option(f"--comm-hook {hook} (16-bit all-reduce) at {n} ranks", half, "; without the casts (not measured)")
        else:
            option(f"--comm-hook {hook} (16-bit all-reduce) at {n} ranks", half + casts[dtype],
                   f"; casts measured {casts[dtype] * 1e3:.1f} ms")
    for every in (2, 4):
        option(f"--sync-every {every} (reduce every {every} iterations) at {n} ranks",
               simulate(profile, comm, Schedule(world_size=n, sync_every=every)).latency + other,
               "; mean per iteration, one optimizer step per cycle")


# The options advised on are those of PyTorch's DDP, which ddp_core takes too (a drop-in): the profile measures
# compute and when each gradient is ready (profiler.py), which do not depend on the DDP that reduces them.
# advise's probes run ddp_core (its timing hooks see each bucket); the options are PyTorch DDP's own,
# and ddp_core takes them with the same meaning, so the advice is for either.
FOR_WHOM = ("advice on the options of PyTorch's DistributedDataParallel (bucket_cap_mb, find_unused_parameters, "
            "gradient_as_bucket_view, comm hooks); the probes measure them with ddp_core, its drop-in")


def format_terminal(report: dict) -> str:
    """The report as plain text: what was profiled, the figures, the bucket layout."""
    width = max(len(f["figure"]) for f in report["figures"])
    lines = [f"ddpbench advise: {report['model']}"
             + (f" ({report['model_config']})" if report["model_config"] else "")
             + (f", amp {report['amp']}" if report["amp"] != "none" else ""),
             FOR_WHOM, f"network: {report['network']} ({report['network_source']})", str(report["profile"])]
    lines += [report["interference"]] if report.get("interference") else []
    lines += [""]
    # Warnings first: a figure read before its caveat misleads (a CPU profile on a GPU cluster, ...).
    lines += [f"warning: {w}" for w in report["warnings"]] + ([""] if report["warnings"] else [])
    lines += [f"{f['figure']:<{width}}  {f['kind']:<9}  {f['value']}" for f in report["figures"]]
    buckets = report.get("buckets", [])
    if buckets:
        lines += ["", "buckets at 25 MB, in gradient arrival order (ms after backward starts):",
                  f"{'bucket':>6} {'tensors':>7} {'MB':>7} {'first':>8} {'complete':>8} {'waits':>7}  last gradient"]
        shown = buckets if len(buckets) <= SHOWN_BUCKETS else buckets[:SHOWN_BUCKETS - 1] + buckets[-1:]
        for b in shown:
            lines.append(f"{b['bucket']:>6} {b['tensors']:>7} {b['MB']:>7.2f} {b['first_ready_ms']:>8.1f} "
                         f"{b['complete_ms']:>8.1f} {b['waits_ms']:>7.1f}  {b['last_gradient']}")
        if len(shown) < len(buckets):
            lines.append(f"  ({len(buckets) - len(shown)} more in the JSON and Markdown)")
    return "\n".join(lines)


def format_markdown(report: dict) -> str:
    """The report as Markdown: the same figures, every bucket."""
    lines = [f"# ddpbench advise: `{report['model']}`", ""]
    if report["model_config"]:
        lines += [f"- model configuration: `{report['model_config']}`"]
    lines += [f"- {FOR_WHOM}", f"- amp: {report['amp']}", f"- network: {report['network']} ({report['network_source']})",
              f"- {report['profile']}"] + ([f"- {report['interference']}"] if report.get("interference") else []) + [""]
    lines += [f"> warning: {w}" for w in report["warnings"]] + ([""] if report["warnings"] else [])
    lines += ["| figure | value | |", "|---|---|---|"]
    lines += [f"| {f['figure']} | {f['value']} | {f['kind']} |" for f in report["figures"]]
    for key, title in (("buckets", "Buckets at 25 MB, in gradient arrival order"),
                       ("buckets_registration_order", "Buckets at 25 MB, in registration order")):
        if report.get(key):
            lines += ["", f"## {title} (ms after backward starts; measured)", "",
                      "| bucket | tensors | MB | first ready | complete | waits | last gradient |", "|---|---|---|---|---|---|---|"]
            lines += [f"| {b['bucket']} | {b['tensors']} | {b['MB']:.2f} | {b['first_ready_ms']:.1f} | "
                      f"{b['complete_ms']:.1f} | {b['waits_ms']:.1f} | `{b['last_gradient']}` |" for b in report[key]]
    return "\n".join(lines) + "\n"


def write_outputs(report: dict, out: Path, markdown: str) -> None:
    """OUT.md and OUT.json."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".md").write_text(markdown)
    out.with_name(out.name + ".json").write_text(json.dumps(report, indent=1, default=str) + "\n")
