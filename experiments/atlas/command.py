"""`ddpbench atlas`: its options, the checks of them (before any process starts), and its entry point:
measure the blocks (runner.py), then write the tables and the figure from the records."""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# runner (the measuring) imports torch: the functions below import it, so that parsing options does not.
from experiments.atlas import plan, tables
from experiments.atlas.figure import heat_map
from experiments.core.config import ConfigError, validate_network

REPO = Path(__file__).resolve().parents[2]
EXIT_BAD_INPUT = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `atlas` sub-command's options."""
    full, quick = plan.FULL, plan.QUICK
    parser.add_argument("--out", type=Path, help="folder of the records (records.jsonl), tables (atlas.md, atlas.csv) "
                                                 "and figure (atlas.png); default results/atlas, with --quick "
                                                 "results/atlas-quick")
    parser.add_argument("--models", metavar="LIST", help=f"comma-separated, of {', '.join(plan.MODELS)} (default: all), "
                                                          f"or of the --quick models {', '.join(plan.QUICK_MODELS)}")
    parser.add_argument("--variants", metavar="LIST",
                        help=f"comma-separated options to measure against the default, of "
                             f"{', '.join(v for v in plan.VARIANTS if v != plan.DEFAULT)} (default: all)")
    parser.add_argument("--links", metavar="LIST", help=f"comma-separated networks: none (loopback) or link rates such as "
                                                         f"1gbit (2 emulated hosts; needs root); default "
                                                         f"{','.join(plan.LINKS)}, with --quick none")
    parser.add_argument("--rounds", type=int, help=f"rounds per block, each one iteration of every variant (default "
                                                    f"{full['rounds']}, with --quick {quick['rounds']})")
    parser.add_argument("--warmup", type=int, help=f"warm-up iterations per variant (default {full['warmup']}, with "
                                                    f"--quick {quick['warmup']}; at least {plan.MIN_WARMUP})")
    parser.add_argument("--memory-gb", type=float, help="memory the replicas of a block may take (default "
                                                        f"{plan.MEMORY_SHARE * 100:.0f}%% of this machine's); a model whose "
                                                        "variants do not all fit is split over several blocks")
    parser.add_argument("--quick", action="store_true", help="tiny models, few rounds, loopback: a check of the "
                                                             "plumbing in about 4 minutes (1 without compile)")
    parser.add_argument("--resume", action="store_true", help="skip blocks already recorded in the --out folder")
    parser.add_argument("--tables-only", action="store_true", help="measure nothing: write the tables and the figure "
                                                                   "from the records in --out")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds one block may take on its ranks (building, warm-up with compilation, rounds); "
                             "default 3600")


@dataclass(frozen=True)
class AtlasOptions:
    """What `ddpbench atlas` measures and where it writes (its flags, typed; None: the plan's default, or with
    quick the quick plan's)."""

    out: Path | None = None
    models: str | None = None
    variants: str | None = None
    links: str | None = None
    rounds: int | None = None
    warmup: int | None = None
    memory_gb: float | None = None
    quick: bool = False
    resume: bool = False
    tables_only: bool = False
    timeout: float = 3600.0


def resolve(options: AtlasOptions) -> tuple[Path, list[plan.Block]]:
    """The output folder and the blocks to measure; ConfigError for any bad input, before any process starts."""
    from experiments.args import check_folder, check_positive
    from experiments.atlas import runner

    defaults = plan.QUICK if options.quick else plan.FULL
    out = options.out or REPO / "results" / ("atlas-quick" if options.quick else "atlas")
    check_folder(out, "out")
    check_positive("timeout", options.timeout)
    known = {**plan.MODELS, **plan.QUICK_MODELS}
    if options.models:
        models = {name: known[name] for name in plan.parse_names("models", options.models, list(known))}
    else:
        models = dict(plan.QUICK_MODELS if options.quick else plan.MODELS)
    others = [v for v in plan.VARIANTS if v != plan.DEFAULT]
    variants = [plan.DEFAULT, *(plan.parse_names("variants", options.variants, others) if options.variants else others)]
    given = options.links or ("none" if options.quick else ",".join(plan.LINKS))
    links = [link.strip().lower() for link in given.split(",")]
    for link in links:
        try:
            validate_network(link, 1, plan.WORLD_SIZE)
        except ConfigError as error:
            raise ConfigError(f"--links={options.links!r}: {error}") from None
    links = list(dict.fromkeys(links))
    records = out / runner.RECORDS
    if options.tables_only:
        if not records.exists():
            raise ConfigError(f"--tables-only: --out={str(out)!r} holds no {runner.RECORDS}; measure first")
        return out, []
    if records.exists() and records.stat().st_size and not options.resume:
        raise ConfigError(f"--out={str(out)!r} already holds records ({records}); add --resume to go on with them, "
                          "or choose another folder")
    rounds = options.rounds if options.rounds is not None else defaults["rounds"]
    warmup = options.warmup if options.warmup is not None else defaults["warmup"]
    memory = options.memory_gb if options.memory_gb is not None else plan.default_memory_gb()
    return out, plan.plan(models, variants, links, rounds, warmup, memory)


def write_results(out: Path) -> list[str]:
    """atlas.csv, atlas.md and atlas.png from out/records.jsonl; returns the paths written."""
    from experiments.atlas import runner
    from experiments.core.records import read_records

    table = tables.rows(out / runner.RECORDS)
    tables.write_csv(table, out / "atlas.csv")
    heat_map(table, out / "atlas.png")
    records = [r for r in read_records(out / runner.RECORDS) if isinstance(r.get("atlas"), dict)]
    walls = {}
    for record in records:  # each block's wall time, once (its records all carry it)
        walls[(record["config"]["link"], record["atlas"]["session"])] = record["atlas"].get("block_wall_s") or 0
    env = records[-1].get("env", {}) if records else {}
    # an atlas resumed or measured network by network may span commits: name each (whether a tree was
    # dirty is in each record's env; an atlas written into a tracked folder dirties it itself)
    commits = dict.fromkeys(str(r.get("env", {}).get("git_commit") or "?")[:12] for r in records)
    lines = ["# DDP options against PyTorch DDP's defaults: the atlas", "",
             "Written by `ddpbench atlas` from `records.jsonl` (docs/atlas.md says how to read it). Each cell: the "
             "option's latency per iteration over the default's, paired round by round in one set of processes, "
             "with its 95% interval; **bold** where it differs after the Benjamini-Hochberg correction over the "
             "network's cells (false discovery rate 5%; column `q_bh` of atlas.csv), since a table of ~130 cells "
             "tested at 95% each would mark ~6 of pure noise.", "",
             f"Measured on {env.get('machine', '?')} ({env.get('cpu', '?')}, {env.get('cpu_count', '?')} cores), torch "
             f"{env.get('torch', '?')}, commit {', '.join(commits) or '?'}; world size 2, "
             f"{records[-1]['config']['threads'] if records else '?'} thread(s) per rank.",
             ""]
    for link in dict.fromkeys(link for link, _ in walls):
        minutes = sum(w for (lk, _), w in walls.items() if lk == link) / 60
        lines.append(f"- {tables.link_name(link)}: {sum(1 for lk, _ in walls if lk == link)} blocks, "
                     f"{minutes:.1f} minutes of measuring")
    lines += ["", tables.markdown(table) if table else "No block has been measured.\n", "![the atlas](atlas.png)", ""]
    (out / "atlas.md").write_text("\n".join(lines))
    return [str(out / name) for name in ("atlas.md", "atlas.csv", "atlas.png")]


def main(options: AtlasOptions) -> int:
    """Check the request, measure its blocks, write the tables and figure; 0 ok, 1 a block failed, 2 bad input."""
    from experiments.atlas import runner

    try:
        out, blocks = resolve(options)
    except ConfigError as error:
        print(f"ddpbench atlas: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    counts = {"ok": 0, "failed": 0, "skipped": 0}
    if blocks:
        started = time.monotonic()
        print(f"ddpbench atlas: {len(blocks)} blocks ({len({b.model for b in blocks})} models x "
              f"{len({b.link for b in blocks})} networks) into {out}", flush=True)
        try:
            counts = runner.run(blocks, out, options.resume, options.timeout, echo=lambda line: print(line, flush=True))
        except KeyboardInterrupt:  # the ranks and any emulated network are gone (runner closes its pool)
            print(f"\nddpbench atlas: interrupted; finished blocks are in {out / runner.RECORDS}; add --resume to go on",
                  file=sys.stderr)
            return 130
        print(f"ddpbench atlas: {counts['ok']} blocks ok, {counts['failed']} failed, {counts['skipped']} skipped "
              f"(already recorded) in {(time.monotonic() - started) / 60:.1f} minutes")
    for path in write_results(out):
        print(f"ddpbench atlas: wrote {path}")
    return 1 if counts["failed"] else 0
