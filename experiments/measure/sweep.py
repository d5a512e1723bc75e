"""Run a list of configs and record each as soon as it is measured.

Configs that share backend, device, world size and threads run in one pool of rank processes (no
start-up cost per config). A config whose rank raises or hangs is recorded as failed, its pool is
replaced, and the sweep goes on; finished configs are never lost, and `--resume` skips them.
Under torchrun, this process is already one rank: configs run in place and rank 0 writes the records.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from tqdm import tqdm

from experiments.core.config import RunConfig, cap_text
from experiments.core.machine import QUIET_CORES, environment, host_key, under_torchrun
from experiments.core.records import (
    LATER_FIELDS,
    RUN_PHASES,
    RecordWriteError,
    SchemaError,
    append_record,
    config_key,
    recorded_keys,
)
from experiments.core.stats import slowest_rank_per_cycle, summarize
from experiments.emulate import network
from experiments.measure import progress, timing_log
from experiments.measure.harness import measure
from experiments.measure.launch import RankFailed, RankPool, RanksTimedOut


def make_record(config: RunConfig, per_rank: list[dict], wall_s: float) -> dict:
    """Combine every rank's raw samples into one record: the slowest rank sets each cycle's latency
    (the breakdown into phases is derived from the raw `phases_s` when records are loaded)."""
    per_rank_latency = [[it["latency"] for it in r["iterations"]] for r in per_rank]
    setting = slowest_rank_per_cycle(per_rank_latency, config.sync_every)
    raw = [per_rank_latency[rank][i] for i, rank in enumerate(setting)]
    digests = [r["digest"] for r in per_rank]
    wrong = [r["rank"] for r in per_rank if r["digest"] != digests[0]]
    # With a time dilation K everything ran K times slower: latencies, phases and bucket times are
    # stored undilated (divided by K), the measured wall times as `raw_latency_s`.
    k = config.time_dilation

    def undilated(seconds):
        return None if seconds is None else seconds / k

    latency = [undilated(t) for t in raw]
    record = {
        "kind": "run",
        "status": "ok",
        "config": dataclasses.asdict(config),
        "latency_s": latency,
        # (emulated compute: the profile's batch is what an iteration stands for)
        "summary": summarize(latency, (per_rank[0].get("compute") or {}).get("batch_size", config.batch_size)
                             * config.world_size),
        "phases_s": {p: [[undilated(it["phases"][p]) for it in r["iterations"]] for r in per_rank] for p in RUN_PHASES},
        "buckets": [{b: [undilated(t) for t in times] for b, times in r["timeline"]["buckets"].items()}
                    if r["timeline"] else None for r in per_rank],
        "correct": not wrong,
        "wrong_ranks": wrong,
        "model_size": per_rank[0].get("model_size"),  # parameters and gradient bytes (issue 15)
        # Where a config's wall time goes besides measuring: model build, warm-up, and the rest (overhead);
        # and how many of the machine's cores were busy meanwhile (an emulation is faithful only with idle ones).
        "timing": {"setup_s": max(r["setup_s"] for r in per_rank), "warmup_s": max(r["warmup_s"] for r in per_rank),
                   "measured_s": sum(raw), "config_wall_s": wall_s, "cores_busy": per_rank[0].get("cores_busy"),
                   "other_cores_busy": other_cores_busy(per_rank)},
        # each rank's peak over the measured iterations (memory.py: how, on this device)
        "memory": {"peak_mb": max(r["memory"]["peak_mb"] for r in per_rank),
                   "peak_mb_per_rank": [r["memory"]["peak_mb"] for r in per_rank],
                   "method": per_rank[0]["memory"]["method"]},
    }
    if per_rank[0].get("auto_bucket") is not None:
        record["auto_bucket"] = auto_bucket_figures(per_rank, undilated)
    if k != 1:
        record["raw_latency_s"] = raw
    if per_rank[0].get("compute") is not None:
        record["compute_source"] = per_rank[0]["compute"]  # which profile the stand-in replayed
    return record


def auto_bucket_figures(per_rank: list[dict], undilated: Callable) -> dict:
    """--bucket-mb auto: what ddp_core chose and why (the same on every rank: rank 0 decides) and the
    iterations it took, each as long as its slowest rank, counted apart from the measured ones."""
    tuning = [max(times) for times in zip(*(r["auto_bucket"]["iterations_s"] for r in per_rank))]
    figures = {k: v for k, v in per_rank[0]["auto_bucket"].items() if k != "iterations_s"}
    return {**figures, "tuning_iterations": len(tuning), "tuning_latency_s": [undilated(t) for t in tuning]}


def other_cores_busy(per_rank: list[dict]) -> float | None:
    """The cores that processes other than the ranks kept busy on average during the measured iterations,
    on rank 0's host: the machine's busy time less what that host's ranks used. None where unknown."""
    loads = [r.get("load") for r in per_rank]
    if None in loads or loads[0]["machine_busy_s"] is None or loads[0]["measuring_s"] <= 0:
        return None
    ours = sum(load["own_cpu_s"] for load in loads if load["host"] == loads[0]["host"])
    return max(0.0, loads[0]["machine_busy_s"] - ours) / loads[0]["measuring_s"]


class BusyConfigs:
    """The configs of a run during which other processes kept more than QUIET_CORES cores busy (their
    latencies then include waiting for them, as `ab` warns): a short mark on each one's line, and one
    warning at the end of the run naming how many, the worst figure and its config (`timing.other_cores_busy`
    stays in every record)."""

    def __init__(self):
        self.busy: list[tuple[float, str]] = []  # (other processes' cores, the config's "[N/M] what")
        self.cores = None

    def mark(self, record: dict, which: str) -> str:
        """' (busy 1.0 cores)' for the line of a config measured while others kept cores busy, else '';
        `which`: the config as the warning names it."""
        other = (record.get("timing") or {}).get("other_cores_busy")
        if other is None or other <= QUIET_CORES:
            return ""
        self.busy.append((other, which))
        self.cores = (record.get("env") or {}).get("cpu_count") or os.cpu_count()
        return f" (busy {other:.1f} cores)"

    def warning(self, measured: int) -> str | None:
        """The run's one warning, of `measured` configs; None where every config was measured quietly."""
        if not self.busy:
            return None
        other, which = max(self.busy)
        if len(self.busy) == 1:
            what = f"kept {other:.1f} of {self.cores} cores busy while {which} was measured: its latencies"
        else:
            what = (f"kept cores busy while {len(self.busy)} of {measured} configs were measured (marked 'busy'; "
                    f"the most, {other:.1f} of {self.cores} cores, during {which}): their latencies")
        return (f"ddpbench: warning: other processes {what} may include waiting for them. Measure again on a quiet "
                "machine (--resume skips only configs already recorded: remove their records or use another --out)")


# Fields a summary line leaves out unless they vary within the sweep: they rarely tell configs apart.
QUIET_FIELDS = ("iters", "warmup", "seed", "reps", "threads")


def varying_fields(jobs: list) -> set[str]:
    """The config fields whose values differ among `jobs` (what tells their summary lines apart)."""
    values: dict[str, set] = {}
    for job in jobs:
        for k, v in dataclasses.asdict(job).items():
            values.setdefault(k, set()).add(v)
    return {k for k, v in values.items() if len(v) > 1}


def config_text(config: dict, varying: set[str] = frozenset()) -> str:
    """What a config is, as `key=value` words: QUIET_FIELDS only where in `varying`, and fields at the
    value records made before they existed imply left out."""
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in config.items()
                    if (k not in QUIET_FIELDS or k in varying) and LATER_FIELDS.get(k, ...) != v)


def summary_line(record: dict, varying: set[str] = frozenset()) -> str:
    """One line per finished job: what it was, its p50 latency with the median's 95% interval over its
    iterations where it has one, and its throughput (or bus bandwidth) where it has one.

    Fields in QUIET_FIELDS are shown only where they are in `varying` (they differ within the sweep).
    """
    what = config_text(record["config"], varying)
    if record["status"] != "ok":
        return f"FAILED {what}: {record['error'].strip().splitlines()[-1]}"
    s = record["summary"]
    if record.get("kind") == "train":  # (its p50 is a loss, not a time)
        return (f"{what}: final loss {s['final_loss_mean']:.4f} (mean of the last tenth), held-out accuracy "
                f"{s['accuracy']:.3f}")
    extra = f", {s['throughput']:.1f} samples/s" if "throughput" in s else ""
    extra += f", busbw {s['busbw_GBps']:.2f} GB/s" if "busbw_GBps" in s else ""
    auto = record.get("auto_bucket")
    if auto is not None:
        extra += (f", auto cap {auto['auto_bucket_cap_mb']:.3g} MB (first {auto['auto_first_bucket_cap_mb']:.3g} MB) "
                  f"chosen in {auto['tuning_iterations']} iterations" if "auto_bucket_cap_mb" in auto
                  else f", auto cap not chosen ({auto['auto_bucket_state']})")
    peak = (record.get("memory") or {}).get("peak_mb")
    extra += f", peak {peak:.0f} MB/rank" if peak is not None else ""
    check = "" if record.get("correct", True) else "  WRONG"
    # the median's 95% interval over this launch's iterations (order statistics; stats.median_interval)
    interval = f" [{s['p50_ci'][0] * 1e3:.2f}, {s['p50_ci'][1] * 1e3:.2f}]" if s.get("p50_ci") else ""
    return f"{what}: p50 {s['p50'] * 1e3:.2f} ms{interval}{extra}{check}"


class IterationBar:
    """A bar of one config's iterations (warm-up, then measured), moved by rank 0's reports
    (experiments.measure.progress): drawn from the first report on, only where `shown`, and cleared
    when closed."""

    def __init__(self, shown: bool, position: int = 0):
        self.shown, self.position, self.bar = shown, position, None

    def __call__(self, phase: str, done: int, total: int) -> None:
        if not self.shown:
            return
        if self.bar is None:
            self.bar = tqdm(total=total, desc=phase, unit="it", dynamic_ncols=True, leave=False,
                            position=self.position)
        elif self.bar.total != total or self.bar.desc != phase or done < self.bar.n:  # a new phase or config
            self.bar.set_description_str(phase, refresh=False)
            self.bar.reset(total=total)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        """Remove the bar from the terminal."""
        if self.bar is not None:
            self.bar.close()


def _pool_key(job) -> tuple:
    """What jobs must share to run in one pool of ranks: backend, device, world size, threads, network."""
    return (job.backend, job.device, job.world_size, job.threads, job.link, job.ranks_per_host,
            getattr(job, "time_dilation", 1.0))


def run_jobs(jobs: list, out: Path, measure_fn: Callable, to_record: Callable, kind: str, resume: bool = False,
             timeout: float = 600.0, on_record: Callable | None = None, echo: Callable = print) -> dict:
    """Measure each job (a frozen dataclass with backend, device, world_size, threads) on its ranks.

    `measure_fn(rank, world_size, fields)` runs on every rank; `to_record(job, per_rank, wall_s)` turns
    the ranks' results into a record. Jobs sharing backend, device, world size, threads and network
    (link, ranks per host) share one pool of processes, wherever they stand in `jobs`; a fresh pool runs its first job once unrecorded
    before measuring it. Returns counts of ok, failed and skipped (already recorded, with `resume`) jobs.
    """
    done = recorded_keys(out) if resume else set()
    todo = [job for job in jobs if config_key(dataclasses.asdict(job)) not in done]
    # Jobs of one pool together (stable, pools in order of first appearance): each pool start costs seconds
    # (new ranks join a process group and import the model's library, then run their first job once unrecorded).
    first_seen: dict[tuple, int] = {}
    for job in todo:
        first_seen.setdefault(_pool_key(job), len(first_seen))
    todo.sort(key=lambda job: first_seen[_pool_key(job)])
    counts = {"ok": 0, "failed": 0, "skipped": len(jobs) - len(todo)}
    if not resume:
        warn_already_recorded(jobs, out)
    warn_oversubscribed(todo)
    env = environment(threads=todo[0].threads if todo else None)
    varying = varying_fields(jobs)
    shown = progress.shown()
    bar = tqdm(total=len(todo), unit="config", disable=not shown, dynamic_ncols=True)
    iterations = IterationBar(shown, position=1)  # below the configs' bar
    say = echo if bar.disable else bar.write

    busy = BusyConfigs()

    try:
        for (backend, _device, world_size, threads, link, ranks_per_host, dilation), group in itertools.groupby(
            todo, key=_pool_key):
            pool = None
            shaped = network.dilated(link, dilation)  # time runs K times slower: so do the links
            try:
                for job in group:
                    fresh = pool is None
                    pool = pool or RankPool(world_size, backend=backend, threads=threads, timeout=timeout,
                                            link=shaped, ranks_per_host=ranks_per_host)
                    per_rank = None
                    try:
                        if fresh:
                            # Freshly started ranks run their first job slower throughout, warm-up or not (a
                            # fresh process re-faults its freed memory every iteration: ViT-B/16 398 ms a step
                            # against 282 ms for the next model, benchmarks/first_model_page_faults.py): run it
                            # once unrecorded, so that every recorded job meets ranks that have already trained.
                            pool.run(measure_fn, (dataclasses.asdict(job),), timeout=timeout)
                        started = time.perf_counter()
                        per_rank = pool.run(measure_fn, (dataclasses.asdict(job),), timeout=timeout,
                                            on_progress=iterations if shown else None)
                        record = to_record(job, per_rank, time.perf_counter() - started)
                    except (RankFailed, RanksTimedOut) as error:
                        record = {"kind": kind, "status": "failed", "error": f"{type(error).__name__}: {error}",
                                  "config": dataclasses.asdict(job)}
                        pool = None  # closed by the failure; the next job gets fresh ranks
                    record["env"] = {**env, "threads_per_rank": threads}
                    if link != "none":
                        record["env"]["network"] = network.describe(
                            shaped, network.hosts_needed(world_size, ranks_per_host))
                        record["env"]["network"].update(emulated_link=link, time_dilation=dilation)
                    record_or_exit(out, record, kind)
                    if on_record is not None and per_rank is not None:
                        on_record(job, record, per_rank)
                    counts[record["status"]] += 1
                    bar.update()
                    # N/M on every line: the only progress shown where stderr is not a terminal (CI, a log)
                    head = f"[{counts['ok'] + counts['failed']}/{len(todo)}]"
                    mark = busy.mark(record, f"{head} {config_text(record['config'], varying)}")
                    say(f"{head} {summary_line(record, varying)}{mark}")
            finally:
                if pool is not None:
                    pool.close(graceful=sys.exc_info()[0] is None)
    finally:
        iterations.close()
        bar.close()
        # once, after the last line (an interrupted run too): how many configs shared the machine, the worst
        if (warning := busy.warning(counts["ok"] + counts["failed"])) is not None:
            print(warning, file=sys.stderr)
    return counts


def record_or_exit(out: Path, record: dict, command: str) -> None:
    """Append `record` to `out`; if it cannot be written (a full disk), end with one line and status 1.

    The records written before stay intact (append_record truncates a partial write back), so a run
    with --resume after freeing space continues where this one stopped.
    """
    try:
        append_record(out, record)
    except RecordWriteError as error:
        # Going on would measure configs whose records are lost, and exit 0 as if all were kept.
        raise SystemExit(f"ddpbench {command}: error: {error}") from None


def warn_already_recorded(jobs: list, out: Path) -> None:
    """Say so when `out` already holds successful records of some of `jobs` (they are measured again)."""
    try:
        done = recorded_keys(out)
    except SchemaError:
        return  # an unreadable file: appending still works, and --resume would say what is wrong
    again = sum(config_key(dataclasses.asdict(job)) in done for job in jobs)
    if again:
        print(f"ddpbench: note: {out} already holds records of {again} of these {len(jobs)} configs; they are "
              "measured again and appended as new records (add --resume to skip them)", file=sys.stderr)


def warn_oversubscribed(jobs: list, cores: int | None = None, ranks_here: int | None = None,
                        under_torchrun: bool = False) -> list[str]:
    """Warn (and return the warnings) where threads per rank x ranks on one host exceed its cores.

    `ranks_here`: the ranks that share this host's `cores` (default: each job's world size, as the
    built-in launcher starts them all here; under torchrun, its LOCAL_WORLD_SIZE)."""
    cores = cores or os.cpu_count() or 1
    ranks_here = ranks_here or int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or None
    warnings = []
    computing = [job for job in jobs if getattr(job, "compute", "real") == "real"]  # emulated compute only waits
    advice = "lower --threads, or start fewer ranks per host" if under_torchrun else "lower --threads or --world-size"
    for threads, ranks in sorted({(job.threads, ranks_here or job.world_size) for job in computing}):
        if threads * ranks > cores:
            warnings.append(f"ddpbench: warning: {ranks} ranks x {threads} threads per rank = {threads * ranks} "
                            f"threads on {cores} cores: ranks wait for a core, and the latency measured includes "
                            f"that wait ({advice})")
    for warning in warnings:
        print(warning, file=sys.stderr)
    return warnings


def hosts_of_ranks() -> dict[str, dict]:
    """Under torchrun: every host of the job, as {host: {"ranks", "cores"}}, from every rank's answer
    (a collective: every rank calls it). torchrun's LOCAL_WORLD_SIZE counts one agent's ranks only;
    two agents on one host share its cores all the same."""
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (host_key(), os.cpu_count() or 1))
    hosts: dict[str, dict] = {}
    for host, cores in everyone:
        hosts.setdefault(host, {"ranks": 0, "cores": cores})["ranks"] += 1
    return hosts


def run_sweep(configs: list[RunConfig], out: Path, resume: bool = False, timeout: float = 600.0,
              trace_dir: Path | None = None, echo: Callable = print) -> dict:
    """Measure every training config (skipping recorded ones with `resume`); see `run_jobs`."""
    if under_torchrun():
        return _run_under_torchrun(configs, out, resume, timeout, trace_dir, echo)

    def trace(config, record, per_rank):
        timing_log.append(record)  # this machine's timings, whatever --out: what --dry-run estimates from
        if trace_dir is not None:
            write_trace(trace_dir, config, per_rank)

    return run_jobs(configs, out, measure, make_record, "run", resume=resume, timeout=timeout, on_record=trace,
                    echo=echo)


def _run_under_torchrun(configs, out, resume, timeout, trace_dir, echo) -> dict:
    """torchrun started this process as one rank: run each config in place (the first once unrecorded
    before it is measured, as run_jobs does with fresh ranks); rank 0 records.

    A failure here ends the sweep (the process group cannot be trusted after it); what was finished
    stays recorded, and torchrun's own restart policy, or --resume, continues.
    """
    backends = {c.backend for c in configs}
    if len(backends) > 1:
        raise ValueError(f"--backend: one backend per torchrun job, got {sorted(backends)}")
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group(backends.pop() if backends else "gloo", timeout=datetime.timedelta(seconds=timeout))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mismatched = [c for c in configs if c.world_size != world_size]
    if mismatched:
        raise ValueError(f"--world-size must be {world_size} under torchrun (got {mismatched[0].world_size})")
    done = recorded_keys(out) if resume and rank == 0 else set()
    shared = [done]
    dist.broadcast_object_list(shared, src=0)  # every rank must skip the same configs
    counts = {"ok": 0, "failed": 0, "skipped": 0}
    env = environment(threads=configs[0].threads if configs else None) if rank == 0 else {}
    varying = varying_fields(configs)
    hosts = hosts_of_ranks()
    if rank == 0:
        # The built-in launcher's warning, once for each kind of host it applies to.
        for ranks_here, cores in sorted({(host["ranks"], host["cores"]) for host in hosts.values()}):
            warn_oversubscribed(configs, cores=cores, ranks_here=ranks_here, under_torchrun=True)
        if not resume:
            warn_already_recorded(configs, out)
    shown = rank == 0 and progress.shown()
    iterations = IterationBar(shown)
    progress.listen(iterations if shown else None)
    fresh = True
    busy = BusyConfigs()
    for config in configs:
        if config_key(dataclasses.asdict(config)) in shared[0]:
            counts["skipped"] += 1
            continue
        # As the built-in launcher's ranks do: a config's threads, not torch's default (every core).
        torch.set_num_threads(config.threads)
        if fresh:  # as run_jobs does with fresh ranks: the process's first job once, unrecorded
            measure(rank, world_size, dataclasses.asdict(config))
            fresh = False
        started = time.perf_counter()
        local = measure(rank, world_size, dataclasses.asdict(config))
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, local)
        if rank == 0:
            record = {**make_record(config, gathered, time.perf_counter() - started), "env": env}
            record_or_exit(out, record, "run")
            timing_log.append(record)
            if trace_dir is not None:
                write_trace(trace_dir, config, gathered)
            head = f"[{counts['ok'] + counts['skipped'] + 1}/{len(configs)}]"
            mark = busy.mark(record, f"{head} {config_text(record['config'], varying)}")
            line = f"{head} {summary_line(record, varying)}{mark}"
            echo(line) if not shown else tqdm.write(line)  # (tqdm.write: above the bar, which it redraws)
        counts["ok"] += 1
    progress.listen(None)
    iterations.close()
    if (warning := busy.warning(counts["ok"])) is not None:  # (rank 0 alone marks configs: None elsewhere)
        print(warning, file=sys.stderr)
    if owned:
        # Every rank leaves together, then the group is torn down: a rank whose process exits while
        # another still talks to it (rank 0 writing the last record) can make Gloo abort at exit.
        dist.barrier()
        dist.destroy_process_group()
    return counts


def write_trace(trace_dir: Path, config: RunConfig, per_rank: list[dict]) -> Path:
    """A Chrome/Perfetto trace of the last measured iteration: phases and bucket all-reduces, per rank."""
    events = []
    for r in per_rank:
        timeline, last = r["timeline"], r["iterations"][-1]
        pid = f"rank {r['rank']}"
        start = 0.0
        for phase in RUN_PHASES:
            duration = last["phases"][phase]
            if duration is None:
                continue
            events.append({"name": phase, "ph": "X", "pid": pid, "tid": "compute", "ts": start * 1e6,
                           "dur": duration * 1e6})
            start += duration
        if timeline:
            for index, (launched, done) in timeline["buckets"].items():
                if done is None:
                    continue
                events.append({"name": f"all-reduce bucket {index}", "ph": "X", "pid": pid, "tid": "communication",
                               "ts": launched * 1e6, "dur": (done - launched) * 1e6})
    trace_dir.mkdir(parents=True, exist_ok=True)
    c = config
    digest = hashlib.sha1(config_key(dataclasses.asdict(c)).encode()).hexdigest()[:8]  # tells apart the rest
    model = c.model.replace("/", "_").replace(":", "-")  # a file path or torchvision:NAME, as one file name
    name = (f"{model}_{c.impl}_{c.backend}-{c.device}_ws{c.world_size}_bucket{cap_text(c.bucket_mb)}_sync{c.sync_every}"
            f"_pg{c.process_groups}_{c.comm_hook}_{digest}")
    path = trace_dir / f"{name}.json"
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    return path

