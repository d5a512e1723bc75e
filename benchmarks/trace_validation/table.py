"""The validation tables of docs/trace.md: predictions from a one-process trace against measurements.

    python benchmarks/trace_validation/table.py RAW > table.md

RAW is the folder measure.sh wrote (default results/trace); the reference machine's is
results/reference/x86_64-2cpu/trace/raw, beside its table.md.

Three parts, each where measure.sh made its files: world size 2 on loopback (`NAME.predict.json`
against `NAME.run.jsonl`, or the loop itself under torch's DDP in `NAME.ddp.txt`), world size 2 on two
emulated hosts behind a 2.5 Gbit/s link (`NAME.link.predict.json` against `NAME.link.run.jsonl`), and
the scale model at 4-16 ranks (`scale/`: each trace read as a profile drives the emulated-compute runs,
which the model predicts from the same profile, as the main job's scale-model validation does).
"""
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for experiments.perfmodel
from experiments.core.records import read_records  # noqa: E402
from experiments.perfmodel.interference import from_record  # noqa: E402
from experiments.perfmodel.validation import describe_errors, prediction_errors  # noqa: E402

TRACED = {"": "alone", "_x2": "beside a 2nd copy"}


def measured_ms(folder: Path, case: str, suffix: str) -> tuple[float, str] | None:
    """The measured median iteration of `case` and how it was measured; None where not measured."""
    run, ddp = folder / f"{case}{suffix}.run.jsonl", folder / f"{case}{suffix}.ddp.txt"
    if run.exists():
        record = json.loads(run.read_text().splitlines()[-1])
        if record.get("status") != "ok":
            return None
        n = len(record["latency_s"])
        return record["summary"]["p50"] * 1e3, f"ddpbench run (ddp_core), p50 of {n}"
    if ddp.exists():
        found = re.search(r"median ([0-9.]+) ms per step over (\d+)", ddp.read_text())
        return (float(found.group(1)), f"the same loop under torch DDP, median of {found.group(2)}") if found else None
    return None


def world_size_two(folder: Path, net: str) -> list[str]:
    """The table of predictions at world size 2 (`net` '' on loopback, '.link' over the link), each without
    the interference term and with the probe's (`NAME{net}.term.predict.json`) where made."""
    rows, errors = [], {(traced, term): [] for traced in TRACED.values() for term in (False, True)}
    for predicted in sorted(folder.glob(f"*{net}.predict.json")):
        name = predicted.name.split(".")[0]
        if predicted.name != f"{name}{net}.predict.json":
            continue  # another network's, or the prediction with the term
        case = name.removesuffix("_x2")  # a trace beside a second copy predicts the same measurement
        traced = TRACED[name[len(case):]]
        measured = measured_ms(folder, case, net)
        if measured is None:
            continue
        row = json.loads(predicted.read_text())["predictions"][0]
        with_term = folder / f"{name}{net}.term.predict.json"
        term = json.loads(with_term.read_text())["predictions"][0]["latency_ms"] if with_term.exists() else None
        error = row["latency_ms"] / measured[0] - 1
        errors[traced, False].append(error)
        shown = "-"
        if term is not None:
            errors[traced, True].append(term / measured[0] - 1)
            shown = f"{term:.1f} ({term / measured[0] - 1:+.1%})"
        rows.append((case, traced, f"| {case} | {traced} | {row['latency_ms']:.1f} | {row['other_ms']:.1f} | "
                                   f"{measured[0]:.1f} | {error:+.1%} | {shown} | {measured[1]} |"))
    lines = ["| case | traced | predicted ms | of it other | measured ms | error | with the interference term (error) "
             "| measured by |", "|---|---|---|---|---|---|---|---|", *(r for _, _, r in sorted(rows))]
    for (traced, term), found in errors.items():
        if found:
            lines += ["", f"traced {traced}, {'with' if term else 'without'} the term: {describe_errors(found)} "
                          f"({len(found)} cases)"]
    return lines


def scale(folder: Path) -> list[str]:
    """The scale model's runs, each predicted from the profile its stand-in replayed (the trace's)."""
    if not folder.is_dir():
        return ["(not measured)"]
    rows = sorted(prediction_errors(folder), key=lambda r: (r["model"], r["world_size"]))
    lines = ["| model | ranks | ranks per host | link | K | cores busy (share) | predicted ms | measured ms | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        busy = "-" if r["busy_share"] is None else f"{r['busy_share']:.0%}"
        lines.append(f"| {r['model']} | {r['world_size']} | {r['ranks_per_host']} | {r['link']} | "
                     f"{r['time_dilation']:g} | {busy} | {r['predicted_s'] * 1e3:.1f} | {r['measured_s'] * 1e3:.1f} | "
                     f"{r['error']:+.1%} |")
    return lines + ["", f"all: {describe_errors([r['error'] for r in rows])} ({len(rows)} runs)"]


def probes(folder: Path) -> list[str]:
    """The interference probes the predictions with the term used (the newest applies)."""
    path = folder / "probes.jsonl"
    found = [r for r in read_records(path) if r.get("kind") == "interference" and r["status"] == "ok"] \
        if path.exists() else []
    return [f"- {from_record(r).describe()}" for r in found] or ["- none measured"]


def main(folder: Path) -> None:
    """Print the three tables found in `folder`."""
    load = folder / "load.txt"
    print("# Predictions from a one-process trace against measurements on this machine (`x86_64-2cpu`)\n")
    print("Made by `benchmarks/trace_validation/measure.sh`; its records are in `raw/` beside this file "
          "(not the traces: 10-100 MB each). The load averages:\n")
    print("\n".join(f"    {line}" for line in load.read_text().splitlines()) if load.exists() else "    (none)")
    print("\nThe interference probes (the newest is the term the predictions `with the term` take):\n")
    print("\n".join(probes(folder)))
    print("\n## World size 2, loopback\n")
    print("\n".join(world_size_two(folder, "")))
    print("\n## World size 2, two emulated hosts behind a 2.5 Gbit/s link\n")
    print("\n".join(world_size_two(folder, ".link")))
    print("\n## The scale model: 4-16 ranks, the traced compute replayed\n")
    print("\n".join(scale(folder / "scale")))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
