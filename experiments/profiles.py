"""The main job's profiles: which `ddpbench` commands reproduce E1-E8 on the hardware at hand.

- smoke: tiny models, a few iterations; the whole job in a few minutes (tests and CI run it).
- quick: ResNet50 and BERT-base with their real parameter counts (which set the communication volume)
  at reduced input sizes, so that on CPUs communication is a share of the iteration comparable to the
  paper's GPUs instead of vanishing under compute; about 30 minutes on 2 cores.
- full: the paper's input sizes (224x224 images, sequence 128); for GPUs.

    python -m experiments.profiles --profile quick --out-dir results/runs/<machine>
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from .cli import main as ddpbench

PROFILES = ("smoke", "quick", "full")


def default_profile() -> str:
    """full where GPUs exist, quick on CPUs."""
    return "full" if torch.cuda.is_available() else "quick"


def commands(profile: str, gpus: int) -> dict[str, list[str]]:
    """Experiment name -> ddpbench arguments (without --out), for `profile` on a machine with `gpus` GPUs."""
    if profile not in PROFILES:
        raise ValueError(f"profile={profile!r} is unknown; choose one of {', '.join(PROFILES)}")
    if gpus:
        backends, device, sizes = "nccl,gloo", "cuda", [1 << k for k in range(10) if 1 << k <= gpus]
    else:
        backends, device, sizes = "gloo", "cpu", [1, 2]
    widest = str(max(sizes))
    world_sizes = ",".join(map(str, sizes))
    if profile == "smoke":
        models, inputs = "resnet-tiny,bert-tiny", ["--image-size", "16", "--seq-len", "8", "--batch-size", "2"]
        iters, caps = ["--iters", "4", "--warmup", "1"], "0,1,25"
        allreduce = ["--total", "262144", "--per-call", "1024,16384,262144", "--sizes", "4096,262144",
                     "--reps", "3", "--warmup", "1"]
        train = ["--iters", "60"]
        sizes = "1024,16384,262144"
    elif profile == "quick":
        # Measured on 2 cores: at these sizes the all-reduce is a large share of the iteration (see the
        # report's E2 row), as on the paper's GPUs; at 224x224 it would be a few percent.
        models, inputs = "resnet50,bert-base", ["--image-size", "32", "--seq-len", "16", "--batch-size", "2"]
        iters, caps = ["--iters", "20", "--warmup", "3"], "0,1,5,10,25,50,100,200"
        allreduce = ["--reps", "3", "--warmup", "1"]
        train = ["--iters", "400"]
        sizes = ",".join(str(2 ** k) for k in range(10, 29))  # 1 KiB .. 256 MiB, for the model's fit
    else:
        models, inputs = "resnet50,bert-base", ["--image-size", "224", "--seq-len", "128", "--batch-size", "32"]
        iters, caps = ["--iters", "20", "--warmup", "5"], "0,1,5,10,25,50,100,200"
        allreduce = ["--reps", "5", "--warmup", "2"]
        train = ["--iters", "1000"]
        sizes = ",".join(str(2 ** k) for k in range(10, 31))
    common = ["--backend", backends, "--device", device, "--model", models, *inputs, *iters, "--threads", "1"]
    if gpus:
        common.remove("--threads")
        common.remove("1")
    return {
        "e1_allreduce": ["allreduce", "--backend", backends, "--device", device, "--world-size", widest, *allreduce],
        "e2_overlap": ["run", *common, "--world-size", widest, "--impl", "ddp_core,ddp_core_no_overlap"],
        "e3_bucket_size": ["run", *common, "--world-size", widest, "--bucket-mb", caps],
        "e4_scaling": ["run", *common, "--world-size", world_sizes],
        "e5_skip_sync": ["run", *common, "--world-size", widest, "--sync-every", "1,2,4,8",
                         # whole cycles of n: the analysis averages each cycle of n iterations
                         *(["--iters", "40"] if profile != "smoke" else ["--iters", "16"])],
        "e6_convergence": ["train", "--backend", backends.split(",")[-1], "--device", device, "--world-size", widest,
                           "--sync-every", "1,2,4,8", *train],
        "e7_round_robin": ["run", *common, "--world-size", widest, "--process-groups", "1,3,5"],
        # The performance model's inputs (issue 5): a one-process profile and a dense all-reduce sweep.
        # On a CPU the ranks of a run share this host's cores: profile as many copies at once as a run has ranks.
        "model_profile": ["profile", "--device", device, "--model", models, *inputs, *iters,
                          *([] if gpus else ["--threads", "1", "--colocated", world_sizes])],
        "model_allreduce": ["allreduce", "--mode", "size", "--backend", backends, "--device", device, "--world-size",
                            widest, "--sizes", sizes, *(allreduce[-4:] if profile == "smoke" else ["--reps", "10"])],
    }


def main(argv: list[str] | None = None) -> int:
    """Run every experiment of a profile, each into its own record file; resumes finished configs."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=PROFILES, default=default_profile())
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--only", help="comma-separated experiment names (default: all)")
    args = parser.parse_args(argv)
    plan = commands(args.profile, torch.cuda.device_count())
    chosen = args.only.split(",") if args.only else list(plan)
    unknown = set(chosen) - set(plan)
    if unknown:
        parser.error(f"--only: unknown experiment(s) {sorted(unknown)}; choose from {', '.join(plan)}")
    failed = 0
    for name in chosen:
        print(f"== {name} ({args.profile}) ==", flush=True)
        status = ddpbench([*plan[name], "--out", str(args.out_dir / f"{name}.jsonl"), "--resume"])
        if status == 2:
            return 2
        failed += status != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
