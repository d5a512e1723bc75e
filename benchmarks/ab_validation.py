"""How often does `ddpbench ab` cry wolf, and how small a slowdown does it catch?

In a throwaway clone of this repository (its committed HEAD): A/B of HEAD against itself, `--same`
times (every alarm is a false alarm), and A/B of HEAD against throwaway commits that slow every
iteration by a known fraction, `--slow` times each. The slowed commit sleeps in ddp_core's
end-of-backward callback, once the all-reduces are complete (a sleep before that would hide behind
the communication still in flight), for that fraction of the time since the previous iteration's
sleep ended: every config of the preset is slowed by the same fraction of its iteration. The A/B
kinds take turns (same, slowed by each fraction, same, ...), so that a noisy spell of the machine
hits them alike. The A/Bs run with this working tree's `ab`; each takes the measurement lock (if
given) so that other measurements on the machine wait. Writes every A/B's verdicts, ratios,
per-round ratios and wall time, and the summary, as JSON.

    python benchmarks/ab_validation.py --same 10 --slow 3 --slowdowns 0.05,0.1 \
        --out results/benchmarks/ab_validation-x86_64-2cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=ab-validation", "-c", "user.email=ab@validation"]
# A line of Reducer._finish_backward, after every all-reduce completed and was written back
ANCHOR = "        self._locally_used = [False] * len(self.params)\n"
SLOW_CODE = """        _time = __import__('time')
        if getattr(self, '_slow_mark', None) is not None:  # ab validation: slow every iteration by {f:g}
            _time.sleep({f} * (_time.perf_counter() - self._slow_mark))
        self._slow_mark = _time.perf_counter()
"""


def ab(repo: Path, base: str, head: str, preset: str, rounds: int | None, lock: str) -> dict:
    """Run one A/B with this tree's `ab` on revisions of `repo`; its exit status, rows and wall time."""
    command = [sys.executable, "-m", "experiments", "ab", base, head, "--preset", preset, "--json",
               "--repo", str(repo), *(["--rounds", str(rounds)] if rounds else [])]
    started = time.time()
    done = subprocess.run(["flock", lock, *command] if lock else command, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    result = {"exit": done.returncode, "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
              "loadavg_before": os.getloadavg()[0]}
    if done.returncode in (0, 1):
        out = json.loads(done.stdout)
        result.update(seconds=out["seconds"], rounds=out["rounds"], other_load=out["other_load"],
                      rows=[{"config": row["config"]["model"], "verdict": row["verdict"], "ratio": row["ratio"],
                             "ci": row["ci"], "method": row["method"], "base_p50_ms": row["base_p50_s"] * 1e3,
                             "round_ratios": row["round_ratios"]} for row in out["rows"]])
    else:
        result["stderr"] = done.stderr[-2000:]
    return result


def slowed_commit(repo: Path, fraction: float) -> str:
    """Commit a copy of main whose every iteration is slowed by `fraction`; return its hash."""
    subprocess.run(["git", "checkout", "-q", "--detach", "main"], cwd=repo, check=True)
    reducer = repo / "ddp_core" / "reducer.py"
    text = reducer.read_text()
    assert text.count(ANCHOR) == 1, f"ddp_core/reducer.py has no single {ANCHOR.strip()!r} to slow down before"
    reducer.write_text(text.replace(ANCHOR, SLOW_CODE.format(f=fraction) + ANCHOR))
    subprocess.run([*GIT, "commit", "-qam", f"slow every iteration by {fraction:.0%}"], cwd=repo, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()


def summarize(results: dict) -> dict:
    """False alarms, detection rate per slowdown (per A/B and per config), and A/B wall time."""
    done = [r for runs in (results["same"], *results["slowed"].values()) for r in runs if "rows" in r]
    summary = {
        "false_alarms": sum(r["exit"] == 1 for r in results["same"]), "same_runs": len(results["same"]),
        "ab_seconds": {"median": statistics.median(r["seconds"] for r in done) if done else None,
                       "max": max((r["seconds"] for r in done), default=None)},
        "detection": {},
    }
    for label, runs in results["slowed"].items():
        configs = sorted({row["config"] for r in runs for row in r.get("rows", [])})
        summary["detection"][label] = {
            "flagged": sum(r["exit"] == 1 for r in runs), "runs": len(runs),
            "per_config": {c: {"flagged": sum(row["verdict"] == "slower" for r in runs for row in r.get("rows", [])
                                              if row["config"] == c),
                               "median_ratio": statistics.median(row["ratio"] for r in runs
                                                                 for row in r.get("rows", []) if row["config"] == c)}
                           for c in configs}}
    reliable = [label for label, d in summary["detection"].items()
                if d["runs"] and all(c["flagged"] == d["runs"] for c in d["per_config"].values())]
    summary["smallest_reliably_detected"] = min(reliable, key=lambda s: float(s.rstrip("%")), default=None)
    return summary


def main() -> None:
    """Parse arguments, run the A/Bs, print a summary and write the JSON (after every A/B)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--same", type=int, default=10, help="A/B runs of HEAD against itself")
    parser.add_argument("--slow", type=int, default=3, help="A/B runs per slowdown")
    parser.add_argument("--slowdowns", default="0.05,0.1", help="comma-separated fractions of the iteration")
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--rounds", type=int, help="A/B rounds (default: the preset's)")
    parser.add_argument("--lock", default="/tmp/ddpbench-measure.lock", help="flock file per A/B ('' for none)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    fractions = [float(f) for f in args.slowdowns.split(",")]
    results: dict = {"same": [], "slowed": {f"{f:.0%}": [] for f in fractions}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ab-validation-") as tmp:
        repo = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
        subprocess.run(["git", "checkout", "-q", "-B", "main"], cwd=repo, check=True)
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
        slowed = {f"{f:.0%}": slowed_commit(repo, f) for f in fractions}
        # Take turns: same, each slowdown, same, ... until every kind has its count.
        schedule = []
        for i in range(max(args.same, args.slow)):
            schedule += (["same"] if i < args.same else []) + ([*slowed] if i < args.slow else [])
        for n, kind in enumerate(schedule, start=1):
            result = ab(repo, head, head if kind == "same" else slowed[kind], args.preset, args.rounds, args.lock)
            (results["same"] if kind == "same" else results["slowed"][kind]).append(result)
            rows = ", ".join(f"{r['config']} {r['ratio']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] {r['verdict']}"
                             for r in result.get("rows", [])) or result.get("stderr", "")[-300:]
            print(f"[{n}/{len(schedule)}] {kind}: exit {result['exit']} in {result.get('seconds', 0):.0f} s; {rows}",
                  flush=True)
            args.out.write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items()}, "commit": head,
                                            "summary": summarize(results), **results}, indent=1) + "\n")
    summary = summarize(results)
    print(f"false alarms: {summary['false_alarms']} of {summary['same_runs']}")
    for label, d in summary["detection"].items():
        print(f"slowdown {label}: flagged {d['flagged']} of {d['runs']}; "
              + ", ".join(f"{c} {v['flagged']}/{d['runs']} (median ratio {v['median_ratio']:.3f})"
                          for c, v in d["per_config"].items()))
    print(f"smallest slowdown flagged every time on every config: {summary['smallest_reliably_detected']}; "
          f"A/B wall time median {summary['ab_seconds']['median']:.0f} s, max {summary['ab_seconds']['max']:.0f} s")


if __name__ == "__main__":
    main()
