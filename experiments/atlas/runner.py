"""The atlas's blocks on their ranks: one pool of rank processes per network (the emulated hosts and
their link are made when the pool starts and removed when it closes, as `run --link` does), the blocks
of every model in turn, each block's variants recorded as soon as it finishes.

A block whose ranks fail or hang is recorded as failed (its pool replaced) and the atlas goes on; a
variant whose DDP reports other options than its config names is recorded as failed too. With `resume`,
blocks whose variants all have records are not measured again.
"""
from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Callable

from experiments.atlas.interleave import measure_block
from experiments.atlas.plan import DEFAULT, WORLD_SIZE, Block, expected_options
from experiments.core.machine import busy_cpu_seconds, environment
from experiments.core.records import append_record, read_records
from experiments.core.stats import paired_ratio, summarize
from experiments.measure.launch import RankFailed, RankPool, RanksTimedOut

RECORDS = "records.jsonl"


def done_blocks(records: Path) -> set[tuple]:
    """(model, link, block, variant) of every variant recorded as measured in `records`."""
    if not records.exists():
        return set()
    return {(r["atlas"]["model"], r["config"]["link"], r["atlas"]["block"], r["atlas"]["variant"])
            for r in read_records(records) if r.get("status") == "ok" and isinstance(r.get("atlas"), dict)}


def mismatches(block: Block, per_rank: list[dict]) -> list[str]:
    """Where a variant's DDP, on some rank, runs with options other than its config's."""
    wrong = []
    for rank, result in enumerate(per_rank):
        for variant, config in block.configs.items():
            expected, seen = expected_options(config), dict(result[variant]["observed"])
            seen.pop("hook_iterations")
            seen.pop("auto_bucket")  # what auto chose: a finding, not an option
            if seen != expected:
                differ = {k: seen[k] for k in expected if seen[k] != expected[k]}
                wrong.append(f"{variant} on rank {rank}: DDP reports {differ}, its config asks for "
                             f"{ {k: expected[k] for k in differ} }")
            if config.comm_hook == "powersgd" and (seen_iters := result[variant]["observed"]["hook_iterations"]) \
                    < config.warmup + config.iters:
                wrong.append(f"{variant} on rank {rank}: PowerSGD ran {seen_iters} iterations, not "
                             f"{config.warmup + config.iters}")
    return wrong


def error_line(error: BaseException) -> str:
    """The line of a rank's traceback that names the exception (its last such line: the one raised)."""
    lines = str(error).strip().splitlines()
    named = [line.strip() for line in lines if re.match(r"\s*[\w.]+(Error|Exception|Timeout|TimedOut)\b", line)]
    return (named or lines or [type(error).__name__])[-1][:300]


def block_line(block: Block, results: dict) -> str:
    """One line per finished block: the default's median, and each option's paired ratio to it."""
    default = results[DEFAULT]["latency_s"]
    parts = []
    for variant, result in results.items():
        if variant != DEFAULT:
            ratio = paired_ratio([[x] for x in result["latency_s"]], [[x] for x in default], confidence=0.95)
            parts.append(f"{variant} {ratio['ratio']:.2f}x [{ratio['ci'][0]:.2f}, {ratio['ci'][1]:.2f}]")
    median = sorted(default)[len(default) // 2]
    return f"{block.model} link={block.link} {block.name}: default p50 {median * 1e3:.0f} ms; " + "; ".join(parts)


def run(blocks: list[Block], out_dir: Path, resume: bool, timeout: float, echo: Callable = print) -> dict:
    """Measure every block not yet recorded (with `resume`), appending each variant's record to
    out_dir/records.jsonl; returns counts of ok, failed and skipped blocks."""
    records = out_dir / RECORDS
    out_dir.mkdir(parents=True, exist_ok=True)
    done = done_blocks(records) if resume else set()
    todo = [b for b in blocks if not all((b.model, b.link, b.name, v) in done for v in b.configs)]
    counts = {"ok": 0, "failed": 0, "skipped": len(blocks) - len(todo)}
    pool, pool_link = None, None
    try:
        for index, block in enumerate(todo, start=1):
            default = block.configs[DEFAULT]
            if pool is None or pool.closed or pool_link != block.link:
                if pool is not None:
                    pool.close()
                pool = RankPool(WORLD_SIZE, backend=default.backend, threads=default.threads, timeout=timeout,
                                link=block.link, ranks_per_host=default.ranks_per_host)
                pool_link = block.link
            session = f"{time.strftime('%Y%m%dT%H%M%S')}-{block.model}-{block.link}-{block.name}"
            env = environment(threads=default.threads)
            fields = {name: dataclasses.asdict(config) for name, config in block.configs.items()}
            before, started = busy_cpu_seconds(), time.monotonic()
            try:
                per_rank = pool.run(measure_block, (fields, session), timeout=timeout)
            except (RankFailed, RanksTimedOut) as error:
                wall = time.monotonic() - started
                for variant, config in block.configs.items():
                    append_record(records, {
                        "kind": "run", "status": "failed", "error": str(error), "config": dataclasses.asdict(config),
                        "env": env, "atlas": {"model": block.model, "variant": variant, "block": block.name,
                                              "session": session, "block_wall_s": wall}})
                counts["failed"] += 1
                echo(f"[{index}/{len(todo)}] FAILED {block.model} link={block.link} {block.name}: {error_line(error)}")
                continue
            wall = time.monotonic() - started
            after = busy_cpu_seconds()
            # the cores other processes kept busy meanwhile (the pool's ranks live on: count their CPU time)
            other = None if None in (before, after) else max(0.0, after - before - per_rank[0][DEFAULT]["ranks_cpu_s"]) / wall
            wrong = mismatches(block, per_rank)
            results = per_rank[0]
            status = {"status": "failed", "error": "; ".join(wrong)} if wrong else {"status": "ok"}
            for variant, config in block.configs.items():
                result = results[variant]
                append_record(records, {
                    "kind": "run", **status, "config": dataclasses.asdict(config), "latency_s": result["latency_s"],
                    "summary": summarize(result["latency_s"], config.batch_size * config.world_size), "env": env,
                    "atlas": {"model": block.model, "variant": variant, "block": block.name, "session": session,
                              "positions": result["positions"], "observed": result["observed"],
                              "build_s": result["build_s"], "warmup_s": result["warmup_s"], "held_mb": result["held_mb"],
                              **({"tuning_s": result["tuning_s"]} if result.get("tuning_s") is not None else {}),
                              "block_wall_s": wall,
                              "other_load": other}})
            counts["failed" if wrong else "ok"] += 1
            echo(f"[{index}/{len(todo)}] " + (f"FAILED {block.model} link={block.link} {block.name}: {status['error']}"
                                               if wrong else block_line(block, results)))
    finally:
        if pool is not None:
            pool.close()
    return counts
