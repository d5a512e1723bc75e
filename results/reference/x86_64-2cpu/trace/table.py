"""The validation table of docs/trace.md: predicted (from a one-process trace) against measured at world size 2.

    python results/reference/x86_64-2cpu/trace/table.py results/trace > results/reference/x86_64-2cpu/trace/table.md
"""
import json
import re
import statistics
import sys
from pathlib import Path


def main(folder: Path) -> None:
    """Print one markdown row per case found in `folder` and the median, mean and worst error."""
    found = []
    for predicted in sorted(folder.glob("*.predict.json")):
        name = predicted.name[: -len(".predict.json")]
        row = json.loads(predicted.read_text())["predictions"][0]
        measured_as = name.removesuffix("_x2")  # a trace beside a second copy predicts the same measurement
        traced = "beside a 2nd copy" if name.endswith("_x2") else "alone"
        run, ddp = folder / f"{measured_as}.run.jsonl", folder / f"{measured_as}.ddp.txt"
        if run.exists():
            record = json.loads(run.read_text().splitlines()[-1])
            measured, how = record["summary"]["p50"] * 1e3, "ddpbench run (ddp_core), p50 of 20"
        elif ddp.exists():
            measured = float(re.search(r"median ([0-9.]+) ms", ddp.read_text()).group(1))
            how = "the same loop under torch DDP, median of 20"
        else:
            continue
        error = (row["latency_ms"] - measured) / measured
        found.append((measured_as, traced, abs(error),
                      f"| {measured_as} | {traced} | {row['latency_ms']:.1f} | {row['other_ms']:.1f} | {measured:.1f} "
                      f"| {error:+.1%} | {how} |"))
    found.sort()  # a case's two traces next to each other
    rows, errors = [f[3] for f in found], [f[2] for f in found]
    print("| case | traced | predicted ms | of it other | measured ms | error | measured by |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    for traced in ("alone", "beside a 2nd copy"):
        mine = [e for r, e in zip(rows, errors) if f"| {traced} |" in r]
        if mine:
            print(f"\ntraced {traced}: median |error| {statistics.median(mine):.1%}, mean {statistics.mean(mine):.1%}, "
                  f"worst {max(mine):.1%} ({len(mine)} cases)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
