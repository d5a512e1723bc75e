"""`ddpbench` (also `python -m experiments`): the command line, wiring each sub-command to the function
that does its work.

Every input is checked before any process starts; a bad one exits with status 2, names the
parameter, the value and what is allowed, and writes nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NoReturn

from experiments.args import EXIT_BAD_INPUT, EXIT_INTERRUPTED, MAX_TIMEOUT_S, check_folder
from experiments.core.config import (
    BACKENDS,
    COMPILE_MODES,
    COMPUTE,
    DEVICES,
    HOOK_NAMES,
    IMPLS,
    LIST_PARAMS,
    TORCH_HOOKS,
    ConfigError,
    RunConfig,
)
from experiments.core.records import show_record_warnings_as_lines
from experiments.measure import plans
from experiments.measure.command import RunOptions, run_configs
from experiments.measure.workloads import WORKLOADS
from experiments.measure.workloads.spec import MODEL_HELP

# The allowed values of the `run` lists that take names, shown in --help.
ALLOWED = {"model": [*sorted(WORKLOADS), MODEL_HELP], "amp": ["none", "bf16", "fp16 (CUDA)"], "impl": list(IMPLS),
           "comm_hook": ["none", *HOOK_NAMES, *TORCH_HOOKS], "backend": list(BACKENDS), "device": list(DEVICES),
           "compute": list(COMPUTE), "compile": list(COMPILE_MODES),
           **{name: ["false", "true"] for name in ("find_unused_parameters", "static_graph", "bucket_view")}}
DEFAULT_BY_HARDWARE = {"backend": "nccl with GPUs, else gloo", "device": "cuda with GPUs, else cpu",
                       "threads": "the cores shared among the ranks"}


def _add_list_params(parser: argparse.ArgumentParser, names: list[str]) -> None:
    defaults = RunConfig()
    for name in names:
        allowed = f" of {', '.join(ALLOWED[name])}" if name in ALLOWED else ""
        if name == "link":
            allowed = " of none (loopback) or link rates such as 1gbit (emulated hosts; needs root)"
        if name == "impl":
            allowed = (" of torch (PyTorch's DistributedDataParallel), ddp_core (this project's rebuild of the paper's "
                       "system), ddp_core_no_overlap (ddp_core reducing after backward)")
        if name == "bucket_mb":
            allowed = (" of caps in MB (0: one parameter per bucket) or auto (ddp_core chooses its cap in its first "
                       "synchronised iterations)")
        if name == "model_config":
            allowed = (" key=value pairs for --model (configuration fields of transformers:, builder keywords of "
                       "torchvision: and of a user file's build_model); several configurations separated by ';'")
        value = getattr(defaults, name)
        default = DEFAULT_BY_HARDWARE.get(name, str(value).lower() if isinstance(value, bool) else repr(value))
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, metavar="LIST",
                            help=f"comma-separated{allowed}; default {default}")


def version() -> str:
    """ddpbench's version and the commit of this tree (with `+dirty` where it has uncommitted changes)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    from experiments.core.git import git_or_empty

    here = Path(__file__).resolve().parent
    try:
        number = installed("ddpbench")
    except PackageNotFoundError:  # run from a clone (./ddpbench): the version pyproject.toml states
        text = (here.parent / "pyproject.toml").read_text()
        number = next((line.split('"')[1] for line in text.splitlines() if line.startswith("version")), "unknown")
    commit = git_or_empty("rev-parse", "--short=12", "HEAD", cwd=here)
    dirty = "+dirty" if git_or_empty("status", "--porcelain", "--untracked-files=no", cwd=here) else ""
    return f"ddpbench {number} (commit {commit or 'unknown'}{dirty})"


class _PrintVersion(argparse.Action):
    """--version, asked for: git runs only then, not on every start of the command line."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(version())
        parser.exit()


@dataclass(frozen=True)
class SubCommand:
    """One sub-command: its line in --help, the function declaring its flags, the typed options they parse
    into (a frozen dataclass), the converter from the parsed command line to them, and the function doing
    the work on them (its exit status)."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    options: type
    function: Callable[[Any], int]
    convert: Callable[[argparse.Namespace, type], Any] | None = None  # None: options_from

    def options_of(self, namespace: argparse.Namespace) -> Any:
        """The typed options of the parsed command line."""
        return (self.convert or options_from)(namespace, self.options)


def options_from(namespace: argparse.Namespace, options: type) -> Any:
    """`options` (a dataclass) with each field taken from the parsed flag of its name."""
    return options(**{f.name: getattr(namespace, f.name) for f in dataclasses.fields(options)})


def run_options(namespace: argparse.Namespace, options: type = RunOptions) -> RunOptions:
    """`run`'s options: the lists given (as text, parsed where the grid is resolved) and the plain flags."""
    grid = {name: getattr(namespace, name) for name in LIST_PARAMS if getattr(namespace, name) is not None}
    plain = {f.name: getattr(namespace, f.name) for f in dataclasses.fields(options) if f.name != "grid"}
    return options(grid=grid, **plain)


def _measuring(add_arguments: Callable) -> Callable:
    """add_arguments, then the flags every measuring command shares (--out, --resume, --timeout)."""
    def add(parser: argparse.ArgumentParser) -> None:
        add_arguments(parser)
        _add_common(parser)

    return add


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    _add_list_params(parser, list(LIST_PARAMS))
    _add_common(parser)
    parser.add_argument("--trace", type=Path, metavar="DIR", help="write a Chrome/Perfetto trace per config here")
    parser.add_argument("--dry-run", action="store_true",
                        help="list the configs, one line each, with the time each would take where records of this "
                             "machine (in --out, results/runs/<machine>/ and its timing log of every config run "
                             "measured here) allow an estimate; runs nothing")


def sub_commands() -> dict[str, SubCommand]:
    """Every sub-command, in the order --help lists them."""
    # Small modules (the measuring and analysing ones import their heavy libraries inside functions).
    from experiments.atlas import command as atlas
    from experiments.emulate import network
    from experiments.measure import allreduce, command, train
    from experiments.perfmodel import advise, predict_command, profile_command, scale_command
    from experiments.regression import ab, compare, drift, drill, history

    return {
        "run": SubCommand("measure training iterations over a grid of configs", _add_run_arguments, RunOptions,
                          command.run, run_options),
        "allreduce": SubCommand("all-reduce microbenchmarks (E1 and a size sweep)",
                                _measuring(allreduce.add_arguments), allreduce.AllreduceOptions, allreduce.main),
        "train": SubCommand("training loss per iteration for sync-every n (E6)", _measuring(train.add_arguments),
                            train.TrainOptions, train.main),
        "profile": SubCommand("one-process profile for the performance model",
                              _measuring(profile_command.add_arguments), profile_command.ProfileOptions,
                              profile_command.main),
        "predict": SubCommand("predict DDP latency from a profile (model)",
                              lambda parser: predict_command.add_arguments(parser, False),
                              predict_command.PredictOptions, predict_command.main),
        "tune-bucket": SubCommand("recommend a bucket cap (model)",
                                  lambda parser: predict_command.add_arguments(parser, True),
                                  predict_command.TuneBucketOptions, predict_command.main),
        "scale-profile": SubCommand("a profile scaled to a GPU's estimated time", scale_command.add_arguments,
                                    scale_command.ScaleProfileOptions, scale_command.main),
        "advise": SubCommand("how DDP will behave for your model: profile, predict, advise", advise.add_arguments,
                             advise.AdviseOptions, advise.main),
        "compare": SubCommand("did latency change between two sets of records?", compare.add_arguments,
                              compare.CompareOptions, compare.main),
        "drift": SubCommand("how far one config's latency strays between launches on this machine (what compare "
                            "needs for one launch a side)", drift.add_arguments, drift.DriftOptions, drift.main),
        "ab": SubCommand("A/B two git revisions on this machine, interleaved", ab.add_arguments, ab.ABOptions, ab.main),
        "history": SubCommand("latency per commit, recorded and plotted", history.add_arguments,
                              history.HistoryOptions, history.main),
        "drill": SubCommand("inject regressions, measure their true size, A/B them", drill.add_arguments,
                            drill.DrillOptions, drill.main),
        "network": SubCommand("can this machine emulate a cluster (--link)? clean up", network.add_arguments,
                              network.NetworkOptions, network.main),
        "main-job": SubCommand("the main job's experiments (what ./run_all.sh runs), each into its own file",
                               _add_main_job_arguments, MainJobOptions, main_job),
        "report": SubCommand("a report of any records (a summary, a figure per varied parameter, findings); without "
                             "records, the main job's report of this machine", _add_report_arguments, ReportOptions,
                             report_command),
        "atlas": SubCommand("what each DDP option costs on real models, against DDP's defaults, interleaved "
                            "(docs/atlas.md)", atlas.add_arguments, atlas.AtlasOptions, atlas.main),
        "machine": SubCommand("this machine's name and fingerprint, which key its results", _add_machine_arguments,
                              MachineOptions, machine_command),
    }


def build_parser() -> argparse.ArgumentParser:
    """The command line: one sub-command per kind of measurement."""
    parser = argparse.ArgumentParser(prog="ddpbench", description="DDP benchmarks after Li et al., VLDB 2020")
    parser.add_argument("--version", action=_PrintVersion, nargs=0, help="print the version and commit, then exit")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in sub_commands().items():
        command.add_arguments(sub.add_parser(name, help=command.help))
    parser.set_defaults(subcommands=sub.choices)  # main() reports a sub-command's unknown options with its usage
    return parser


def _add_main_job_arguments(job: argparse.ArgumentParser) -> None:
    job.add_argument("--profile", choices=plans.PROFILES, default=None,
                     help="smoke, quick or full (default: full with GPUs, else quick)")
    job.add_argument("--out-dir", type=Path, required=True, help="folder of the record files, one per experiment")
    job.add_argument("--only", help="comma-separated experiment names (default: all)")


def _add_report_arguments(report: argparse.ArgumentParser) -> None:
    report.add_argument("records", nargs="*", type=Path, help="record files or folders of `ddpbench run`")
    report.add_argument("--out", type=Path, help="folder of the report of RECORDS (default: beside the first, "
                                                  "<name>-report/)")
    report.add_argument("--html", action="store_true", help="also write one self-contained page, index.html")
    report.add_argument("--smoke", action="store_true", help="the smoke profile's results (results/smoke/)")
    report.add_argument("--reference", metavar="MACHINE", nargs="?", const="x86_64-2cpu",
                        help="rebuild the project's committed reference results of MACHINE instead "
                             "(results/reference/MACHINE/; default x86_64-2cpu), whose numbers the docs quote")


def _add_machine_arguments(machine: argparse.ArgumentParser) -> None:
    machine.add_argument("--machine", metavar="NAME", help="rename this machine (its later results go under NAME)")


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="JSON-lines record file (appended to)")
    parser.add_argument("--resume", action="store_true", help="skip configs already recorded in --out")
    # The clock starts when a config is handed to its ranks (launch.RankPool.run); the ranks are started just
    # before and not waited for, so the first config of each set of ranks also pays for their start-up.
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds one config may take, from handing it to its ranks until all have answered "
                             "(building the model, warm-up, measuring); the first config of each set of ranks (a "
                             "new world size, backend, device, thread count or network, or the next config after a "
                             "failure) also includes the ranks' start-up: forking them (the run's first set also "
                             "imports torch once), joining the process group, importing the model's library. It is also the ranks' timeout for one collective (under torchrun, "
                             f"only that). Default 600; at most {MAX_TIMEOUT_S} (a year)")


def resolve_run_configs(args: argparse.Namespace) -> list[RunConfig]:
    """Expand the `run` lists of a parsed command line into validated configs, filling hardware-dependent defaults."""
    return run_configs(run_options(args))


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@dataclass(frozen=True)
class MainJobOptions:
    """Which of the main job's experiments run (only: comma-separated names, None: all), with which profile
    (None: full with GPUs, else quick), into which folder."""

    out_dir: Path
    profile: str | None = None
    only: str | None = None


def main_job(options: MainJobOptions) -> int:
    """Run every experiment of a main-job profile, each into out_dir/<name>.jsonl, resuming finished
    configs; exit 2 on bad input, 130 once a step was interrupted (the steps after it do not run), 1 if
    some config failed."""
    import torch

    profile = options.profile or plans.default_profile()
    steps = plans.plan(profile, torch.cuda.device_count(), options.out_dir)
    chosen = options.only.split(",") if options.only else list(steps)
    unknown = sorted(set(chosen) - set(steps))
    if unknown:
        print(f"ddpbench main-job: error: --only: unknown experiment(s) {unknown}; choose from {', '.join(steps)}",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    needs_network = [name for name in chosen if name.startswith(("link_", "scale_"))]
    if needs_network:
        from experiments.emulate import network

        problems = network.check()
        if problems:
            print(f"== skipping the emulated cluster ({', '.join(needs_network)}): "
                  f"this machine cannot emulate one: {'; '.join(problems)} ==", flush=True)
            chosen = [name for name in chosen if name not in needs_network]
    failed = 0
    for name in chosen:
        print(f"== {name} ({profile}) ==", flush=True)
        status = run_step(steps[name], options.out_dir / f"{name}.jsonl")
        if status == EXIT_BAD_INPUT:
            return EXIT_BAD_INPUT
        plans.note_profile(options.out_dir, name, profile)
        if status == EXIT_INTERRUPTED:  # Ctrl-C stops the job, not just this step (and the steps ignore it after)
            return EXIT_INTERRUPTED
        failed += status != 0
    return 1 if failed else 0


def run_step(step: plans.Step, out: Path) -> int:
    """One step of the main job: its sub-command's function on the step's typed options, resuming into `out`."""
    command = sub_commands()[step.command]
    if command.options is RunOptions:
        return command.function(RunOptions(out=out, grid=dict(step.options), resume=True))
    return command.function(command.options(**step.options, out=out, resume=True))


def only_smoke_records(results: Path, machine: str) -> Path | None:
    """The machine's smoke records folder where the smoke profile is all that ran here (no main job's
    records), else None."""
    smoke_runs = results / "smoke" / "runs" / machine
    # record files, not the folder: any `run` leaves its timing log there (measure/timing_log.py)
    main_records = any((results / "runs" / machine).glob("*.jsonl"))
    return smoke_runs if smoke_runs.is_dir() and not main_records else None


def report(smoke: bool, reference: str | None) -> int:
    """Rebuild the main job's figures and report: this machine's (results/, or results/smoke/), or with
    `reference` the committed reference results of that machine (results/reference/<machine>/)."""
    import importlib

    results = Path(__file__).resolve().parent.parent / "results"
    if reference is not None:
        folder = results / "reference" / reference
        if not (folder / "runs" / reference).is_dir():
            known = sorted(p.name for p in (results / "reference").iterdir()) if (results / "reference").is_dir() else []
            print(f"ddpbench report: error: --reference={reference!r} has no results under {folder}; "
                  f"known: {', '.join(known) or 'none'}", file=sys.stderr)
            return EXIT_BAD_INPUT
        os.environ["DDPBENCH_RESULTS"], os.environ["DDPBENCH_MACHINE"] = str(folder), reference
    elif smoke:
        os.environ.setdefault("DDPBENCH_RESULTS", str(results / "smoke"))
    elif "DDPBENCH_RESULTS" not in os.environ:
        from experiments.core.machine import machine_name

        smoke_runs = only_smoke_records(results, machine_name())
        if smoke_runs is not None:
            print(f"ddpbench report: error: this machine has only smoke records ({smoke_runs}); "
                  "`./ddpbench report --smoke` reports them, `./run_all.sh` makes the real ones", file=sys.stderr)
            return EXIT_BAD_INPUT
    # The analysis scripts live beside the suite, not in its package: import the report by name.
    draw_report = importlib.import_module("analysis.report").main
    return draw_report([])  # its records and folder from the environment set above


def sweep_report(records: list[Path], out: Path | None, with_html: bool) -> int:
    """Write the report of the user's own records (see experiments/report/sweep.py) and print its findings."""
    from experiments.report.sweep import write_report

    missing = [str(p) for p in records if not p.exists()]
    if missing:
        print(f"ddpbench report: error: RECORDS: {', '.join(missing)} not found", file=sys.stderr)
        return EXIT_BAD_INPUT
    first = records[0]
    out = out or first.parent / f"{first.stem if first.is_file() else first.name}-report"
    try:
        check_folder(out, "out")
        lines = write_report(records, out, with_html)
    except (ConfigError, ValueError) as error:
        print(f"ddpbench report: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for line in lines:
        print(line)
    print(f"ddpbench report: {out / 'report.md'}" + (f" and {out / 'index.html'}" if with_html else ""))
    return 0


def machine(new_name: str | None) -> int:
    """Print this machine's name, id and fingerprint (after renaming it to `new_name`, if given)."""
    from experiments.core.machine import machine_file, rename_machine, this_machine

    try:
        current = rename_machine(new_name) if new_name is not None else this_machine()
    except ConfigError as error:
        print(f"ddpbench machine: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"machine: {current['name']} (id {current['id']}; named in {machine_file()})")
    for key, value in current["fingerprint"].items():
        print(f"  {key}: {value}")
    print(f"its results: results/runs/{current['name']}/ (the project's own: results/reference/)")
    return 0


@dataclass(frozen=True)
class ReportOptions:
    """Which report `ddpbench report` writes: of the user's records (into out, with an HTML page if html), or
    without records the main job's (of results/smoke with smoke, of a committed reference machine)."""

    records: list[Path]
    out: Path | None = None
    html: bool = False
    smoke: bool = False
    reference: str | None = None


def report_command(options: ReportOptions) -> int:
    """`ddpbench report`: the report of the records given, else the main job's report; 2 on bad input."""
    if options.records:
        return sweep_report(options.records, options.out, options.html)
    if options.out is not None or options.html:
        print("ddpbench report: error: --out and --html are for a report of RECORDS; the main job's report "
              "goes to results/report.md", file=sys.stderr)
        return EXIT_BAD_INPUT
    return report(options.smoke, options.reference)


@dataclass(frozen=True)
class MachineOptions:
    """`ddpbench machine`: the new name of this machine, if it is renamed."""

    machine: str | None = None


def machine_command(options: MachineOptions) -> int:
    """`ddpbench machine`: print this machine's name and fingerprint, renaming it first where asked."""
    return machine(options.machine)


def entry_point() -> NoReturn:
    """The `ddpbench` command (the console script of `pip install -e .`, `python -m experiments` and
    ./ddpbench alike): main() on the command line, its status the process's exit status."""
    status = main()
    if status == EXIT_INTERRUPTED:
        # Stopping after Ctrl-C: another Ctrl-C (a user pressing it again) must not break the exit half-way
        # (atexit handlers flushing records and removing what the run made).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(status)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status (0 ok, 1 some config failed, 2 bad input, 130 Ctrl-C).

    The caller's SIGINT and SIGTERM handlers are theirs again on return: a program (or test) that calls
    main() keeps its own Ctrl-C.
    """
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _main(argv)
    finally:
        for signum, handler in saved.items():
            if handler is not None:  # None: a handler not installed from Python, which Python cannot put back
                signal.signal(signum, handler)


def _main(argv: list[str] | None) -> int:
    """main() without restoring the signal handlers."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse would print the top-level usage; the sub-command's says what it takes
        args.subcommands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    show_record_warnings_as_lines()
    # A polite kill (SIGTERM) unwinds like Ctrl-C, so ranks and emulated networks are removed on the way out.
    signal.signal(signal.SIGTERM, _terminate)
    command = sub_commands()[args.command]
    return command.function(command.options_of(args))
