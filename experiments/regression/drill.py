"""`ddpbench drill`: does the gate catch the regressions DDP commits really make?

For each preset: the injections (see injections.py) are committed as throwaway commits on the base
commit; their true sizes are measured apart from the gate (truth.py: long interleaved runs of the
base, a second copy of the base and every injected commit, in several fresh sets of processes); then `ddpbench ab` runs `--repeats` times
against each injected commit and `--same` times against the base itself, taking turns, each A/B
under the measurement lock. Detection is judged against the true size: the goal is that every
regression at least 5% slower in truth is flagged in 9 of 10 A/Bs. Steps:

- `truth`: `--truth-rounds` fresh sets of processes, each running the base, a second copy of it and
  every injected commit interleaved iteration by iteration (truth.in_processes; resumes at the first
  unfinished round);
- `noise`: same-against-same ratios of instrument variants (each model in processes of its own,
  ranks pinned to cores) beside the current instrument, interleaved the same way;
- `ab`: the A/Bs, resumed from the JSON (each kind until it has its count).

The JSON (`--out`) is rewritten after every step and A/B; a Markdown summary sits beside it; the
raw records of truth and noise stay under the folder of the same name.

    ./ddpbench drill --preset smoke,link --repeats 10 --same 20      # the whole goal, unattended
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from experiments.core.config import ConfigError
from experiments.core.git import resolve_commit
from experiments.core.machine import machine_name
from experiments.regression import report
from experiments.regression.ab import PRESETS, run_commands
from experiments.regression.injections import INJECTIONS, check_names, commit_injections
from experiments.regression.truth import in_processes, interleave, true_sizes

ROOT = Path(__file__).resolve().parents[2]
STEPS = ("truth", "noise", "ab")
LOCK = "/tmp/ddpbench-measure.lock"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `drill` sub-command's options."""
    parser.add_argument("--base", default="HEAD", help="the commit the regressions are injected into (default HEAD)")
    parser.add_argument("--preset", default="smoke", help="comma-separated presets, e.g. smoke,link (default smoke)")
    parser.add_argument("--regressions", default=",".join(INJECTIONS),
                        help=f"comma-separated, of {', '.join(INJECTIONS)} (default: all)")
    parser.add_argument("--steps", default="truth,ab", help=f"comma-separated, of {', '.join(STEPS)} (default truth,ab)")
    parser.add_argument("--truth-rounds", type=int, default=4,
                        help="rounds of the truth run: fresh process sets, each interleaving every commit (default 4)")
    parser.add_argument("--repeats", type=int, default=10, help="A/Bs against each regression (default 10)")
    parser.add_argument("--same", type=int, default=20, help="A/Bs of the base against itself (default 20)")
    parser.add_argument("--lock", default=LOCK, help=f"flock file held per round and per A/B ('' for none; default {LOCK})")
    # The default names this machine, which takes torch to find out: check() fills it in, not the parser.
    parser.add_argument("--out", type=Path, default=None,
                        help="summary JSON (rewritten as it goes; resumed); Markdown and raw records beside it")
    parser.add_argument("--repo", type=Path, default=ROOT, help=argparse.SUPPRESS)


@dataclass(frozen=True)
class DrillOptions:
    """Which regressions `ddpbench drill` injects, which steps it runs on them, and where it keeps its state
    (its flags, typed; out None: results/benchmarks/drill-<machine>.json)."""

    base: str = "HEAD"
    preset: str = "smoke"
    regressions: str = ",".join(INJECTIONS)
    steps: str = "truth,ab"
    truth_rounds: int = 4
    repeats: int = 10
    same: int = 20
    lock: str = LOCK
    out: Path | None = None
    repo: Path = ROOT


def check(options: DrillOptions) -> tuple[list[str], list[str], list[str], Path]:
    """Presets, regressions, steps and the summary file from the options; ConfigError naming the first bad one."""
    from experiments.args import check_output

    presets, names, steps = (options.preset.split(","), options.regressions.split(","), options.steps.split(","))
    for preset in presets:
        if preset not in PRESETS:
            raise ConfigError(f"--preset={preset!r} is not allowed; choose from {', '.join(sorted(PRESETS))}")
    check_names(names)
    for step in steps:
        if step not in STEPS:
            raise ConfigError(f"--steps={step!r} is not allowed; choose from {', '.join(STEPS)}")
    for flag, value, minimum in (("truth-rounds", options.truth_rounds, 3), ("repeats", options.repeats, 0),
                                 ("same", options.same, 0)):
        if value < minimum:
            raise ConfigError(f"--{flag}={value} is not allowed; it must be >= {minimum}")
    out = options.out or ROOT / "results" / "benchmarks" / f"drill-{machine_name()}.json"
    check_output(out)
    if any(PRESETS[p]["grid"].get("link", ["none"]) != ["none"] for p in presets):
        from experiments.emulate import network

        problems = network.check()
        if problems:
            raise ConfigError(f"--preset={options.preset}: the link preset needs an emulated network, which this "
                              f"machine cannot make: {'; '.join(problems)}")
    return presets, names, steps, out


def run_ab(repo: Path, base: str, head: str, preset: str, lock: str) -> dict:
    """One `ddpbench ab` (this tree's) of two revisions of `repo`, under the lock: exit status, wall time, rows."""
    command = [sys.executable, "-m", "experiments", "ab", base, head, "--preset", preset, "--json", "--repo", str(repo)]
    started = time.time()
    done = subprocess.run(["flock", lock, *command] if lock else command, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    result = {"exit": done.returncode, "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(started))}
    try:
        out = json.loads(done.stdout) if done.returncode in (0, 1) else None
    except json.JSONDecodeError:  # a crash that exited 1: no verdict
        out = None
    if out is not None:
        result.update(seconds=out["seconds"], rounds=out["rounds"], other_load=out["other_load"],
                      interleave=out.get("interleave"), threshold=out.get("threshold"),
                      rows=[{"config": row["config"]["model"], "verdict": row["verdict"], "ratio": row["ratio"],
                             "ci": row["ci"], "round_ratios": row["round_ratios"]} for row in out["rows"]])
    else:
        result["stderr"] = done.stderr[-2000:]
    return result


def schedule(names: list[str], repeats: int, same: int, done: dict[str, int]) -> list[str]:
    """The A/Bs still to run, taking turns (same, each regression, same, ...), less those `done` has."""
    order: list[str] = []
    for i in range(max(repeats, same)):
        order += (["same"] if i < same else []) + (names if i < repeats else [])
    left = dict(done)
    todo = []
    for kind in order:
        if left.get(kind, 0) > 0:
            left[kind] -= 1
        else:
            todo.append(kind)
    return todo


def main(options: DrillOptions) -> int:
    """Run the chosen steps for every preset; 2 on bad input."""
    try:
        presets, names, steps, out = check(options)
        base = resolve_commit(options.base, options.repo, "--base")
        commits = commit_injections(options.repo, base, names)
    except ConfigError as error:
        print(f"ddpbench drill: error: {error}", file=sys.stderr)
        return 2
    options = replace(options, out=out)  # the summary file named, for the steps and the messages below
    state = json.loads(options.out.read_text()) if options.out.exists() else {}
    if state.get("base") != base:
        state = {"base": base, "presets": {}}
    state["commits"] = commits
    state["injections"] = {n: INJECTIONS[n][0] for n in INJECTIONS}
    try:
        run_steps(options, state, presets, names, steps, base, commits)
    except KeyboardInterrupt:
        print(f"\nddpbench drill: interrupted; finished rounds and A/Bs are kept ({options.out}); run the same "
              "command again to go on", file=sys.stderr)
        return 130
    except RuntimeError as error:  # a revision that cannot run the preset, or a truth folder of another design
        # (truth.py turns every failure of a round into a RuntimeError; ab's failures are A/B results)
        print(f"ddpbench drill: error: {error}", file=sys.stderr)
        return 1
    print(f"drill: summary in {options.out} and {options.out.with_suffix('.md')}")
    return 0


def run_steps(options: DrillOptions, state: dict, presets: list[str], names: list[str], steps: list[str],
              base: str, commits: dict[str, str]) -> None:
    """The chosen steps for every preset, saving the state after each step and A/B."""
    raw = options.out.with_suffix("")
    save = lambda: report.write(state, options.out)  # noqa: E731 - after every step and A/B
    for preset in presets:
        mine = state["presets"].setdefault(preset, {"truth": {}, "noise": {}, "abs": []})
        # the commits this preset's results were measured at (an injection's hash changes with its text)
        mine.setdefault("commits", dict(commits))
        if "truth" in steps:
            folder = raw / preset / "truth"
            entries = {"base": base, "null": base, **commits}
            in_processes(options.repo, entries, preset, options.truth_rounds, folder, options.lock)
            mine["truth"] = true_sizes(folder, {"same": ("null", "base"), **{n: (n, "base") for n in names}})
            save()
        if "noise" in steps:
            mine["noise"] = noise(options.repo, base, preset, options.truth_rounds, raw / preset / "noise",
                                  options.lock)
            save()
        if "ab" in steps:
            done: dict[str, int] = {}
            for result in mine["abs"]:
                done[result["kind"]] = done.get(result["kind"], 0) + 1
            todo = schedule(names, options.repeats, options.same, done)
            for n, kind in enumerate(todo, start=1):
                result = {"kind": kind, **run_ab(options.repo, base, base if kind == "same" else commits[kind], preset,
                                                 options.lock)}
                mine["abs"].append(result)
                save()
                rows = ", ".join(f"{r['config']} {r['ratio']:.3f} {r['verdict']}" for r in result.get("rows", []))
                print(f"drill {preset} A/B {n}/{len(todo)} {kind}: exit {result['exit']} in "
                      f"{result.get('seconds', 0):.0f} s; {rows or result.get('stderr', '')[-300:]}", flush=True)
    save()


def noise(repo: Path, base: str, preset: str, rounds: int, folder: Path, lock: str) -> dict:
    """Same-against-same spread of the instrument as it is and of its variants, interleaved in one session."""
    variants = commit_injections(repo, base, ["pinned"])
    entries = {"base": (base, False), "null": (base, False), "pinned": (variants["pinned"], False),
               "pinned-null": (variants["pinned"], False)}
    pairs = {"as is": ("null", "base"), "ranks pinned to cores": ("pinned-null", "pinned"),
             "pinned against as is": ("pinned", "base")}
    if len(run_commands(preset, True)) > 1:  # one model: its own processes already
        entries.update({"separate": (base, True), "separate-null": (base, True)})
        pairs.update({"each model in its own processes": ("separate-null", "separate"),
                      "separate against as is": ("separate", "base")})
    interleave(repo, entries, preset, rounds, folder, lock)
    return true_sizes(folder, pairs)
