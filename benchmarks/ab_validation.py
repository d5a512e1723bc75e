"""How often does `ddpbench ab` cry wolf, and does it catch a real slowdown?

In a throwaway clone of this repository: A/B of HEAD against itself, `--same` times (every alarm is a
false alarm), and A/B of HEAD against commits that add a fixed delay to every backward pass (in
ddp_core's end-of-backward callback), `--slow` times each. Writes every verdict and ratio as JSON.

    python benchmarks/ab_validation.py --same 3 --slow 1 --delays-ms 2,5 \
        --out results/benchmarks/ab_validation-x86_64-2cpu.json
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=ab-validation", "-c", "user.email=ab@validation"]


def ab(repo: Path, base: str, head: str, rounds: int) -> dict:
    """Run one A/B; return its exit status and the table's rows (mark, ratio, config)."""
    done = subprocess.run([sys.executable, "-m", "experiments", "ab", base, head, "--preset", "smoke",
                           "--rounds", str(rounds), "--repo", str(repo)], cwd=repo, capture_output=True, text=True)
    rows = []
    for line in done.stdout.splitlines():
        match = re.match(r"^([+\- ~])\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+) \[([\d.]+), ([\d.]+)\]\s+(.*)$", line)
        if match:
            mark, before, after, ratio, low, high, config = match.groups()
            rows.append({"mark": mark, "before_ms": float(before), "after_ms": float(after), "ratio": float(ratio),
                         "ci": [float(low), float(high)], "config": config})
    return {"exit": done.returncode, "rows": rows, "stderr": done.stderr[-2000:] if done.returncode == 2 else ""}


def slowed_commit(repo: Path, delay_ms: float) -> str:
    """Commit a copy of HEAD whose every synchronised backward sleeps `delay_ms`; return its hash."""
    subprocess.run(["git", "checkout", "-q", "--detach", "main"], cwd=repo, check=True)
    reducer = repo / "ddp_core" / "reducer.py"
    text = reducer.read_text().replace(
        "    def _finish_backward(self) -> None:\n",
        f"    def _finish_backward(self) -> None:\n        __import__('time').sleep({delay_ms / 1000})\n", 1)
    reducer.write_text(text)
    subprocess.run([*GIT, "commit", "-qam", f"slow by {delay_ms} ms"], cwd=repo, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()


def main() -> None:
    """Parse arguments, run the A/Bs, print a summary and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--same", type=int, default=10, help="A/B runs of HEAD against itself")
    parser.add_argument("--slow", type=int, default=3, help="A/B runs per delay")
    parser.add_argument("--delays-ms", default="2,5", help="comma-separated delays added to each backward")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results = {"same": [], "slowed": {}}
    with tempfile.TemporaryDirectory(prefix="ab-validation-") as tmp:
        repo = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
        subprocess.run(["git", "checkout", "-q", "-B", "main"], cwd=repo, check=True)
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
        for i in range(args.same):
            started = time.monotonic()
            results["same"].append({**ab(repo, head, head, args.rounds), "seconds": time.monotonic() - started})
            print(f"same {i + 1}/{args.same}: exit {results['same'][-1]['exit']}", flush=True)
        for delay in [float(d) for d in args.delays_ms.split(",")]:
            slow = slowed_commit(repo, delay)
            runs = results["slowed"][f"{delay:g}ms"] = []
            for i in range(args.slow):
                runs.append(ab(repo, head, slow, args.rounds))
                print(f"slowed by {delay:g} ms {i + 1}/{args.slow}: exit {runs[-1]['exit']}; "
                      + ", ".join(f"{r['config'].split()[0]} {r['ratio']:.3f}{r['mark']}" for r in runs[-1]["rows"]),
                      flush=True)
    false_alarms = sum(r["exit"] == 1 for r in results["same"])
    print(f"false alarms: {false_alarms} of {args.same}")
    for delay, runs in results["slowed"].items():
        print(f"slowdown {delay}: flagged {sum(r['exit'] == 1 for r in runs)} of {len(runs)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items()}, **results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
