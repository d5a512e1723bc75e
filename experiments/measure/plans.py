"""The main job's plans: which `ddpbench` steps reproduce E1-E8 on the hardware at hand, as data.

- smoke: tiny models, a few iterations; the whole job in a few minutes (tests and CI run it).
- quick: ResNet50 and BERT-base with their real parameter counts (which set the communication volume)
  at reduced input sizes, so that on CPUs communication is a share of the iteration comparable to the
  paper's GPUs instead of vanishing under compute; about 30 minutes on 2 cores.
- full: the paper's input sizes (224x224 images, sequence 128); for GPUs.

Each experiment is a `Step`: a sub-command and its options as typed values (the fields of the
sub-command's options; a list is a grid axis, as `run` takes it). `./run_all.sh` runs them through
`ddpbench main-job`, which hands each to its sub-command's function, each into its own record file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

PROFILES = ("smoke", "quick", "full")
PROFILE_FILE = "profile.json"  # beside the records: which profile measured each experiment (the report says)


@dataclass(frozen=True)
class Step:
    """One experiment of the main job: a `ddpbench` sub-command and its options (typed values)."""

    command: str
    options: dict = field(default_factory=dict)

    def with_options(self, **changes) -> "Step":
        """The same step with some options changed or added (None removes one)."""
        options = {**self.options, **changes}
        return Step(self.command, {k: v for k, v in options.items() if v is not None})


def default_profile() -> str:
    """full where GPUs exist, quick on CPUs."""
    import torch  # seconds to import: not when the command line is only being parsed

    return "full" if torch.cuda.is_available() else "quick"


def powers_of_two(low: int, high: int) -> list[int]:
    """2**low .. 2**high."""
    return [2 ** k for k in range(low, high + 1)]


def plan(profile: str, gpus: int, out_dir: Path) -> dict[str, Step]:
    """Experiment name -> Step, for `profile` on a machine with `gpus` GPUs; the scale model's steps read
    the profiles that earlier steps record in `out_dir`."""
    if profile not in PROFILES:
        raise ValueError(f"profile={profile!r} is unknown; choose one of {', '.join(PROFILES)}")
    if gpus:
        backends, device, sizes = ["nccl", "gloo"], ["cuda"], [1 << k for k in range(10) if 1 << k <= gpus]
    else:
        backends, device, sizes = ["gloo"], ["cpu"], [1, 2]
    widest = [max(sizes)]
    if profile == "smoke":
        models, inputs = ["resnet-tiny", "bert-tiny"], {"image_size": [16], "seq_len": [8], "batch_size": [2]}
        iters, caps = {"iters": [4], "warmup": [1]}, [0, 1, 25]
        allreduce = {"total": 262144, "per_call": [1024, 16384, 262144], "sizes": [4096, 262144], "reps": 3,
                     "warmup": 1}
        train_iters = 60
        model_sizes, model_reps = [1024, 16384, 262144], {"reps": 3, "warmup": 1}
    elif profile == "quick":
        # Measured on 2 cores: at these sizes the all-reduce is a large share of the iteration (see the
        # report's E2 row), as on the paper's GPUs; at 224x224 it would be a few percent.
        models, inputs = ["resnet50", "bert-base"], {"image_size": [32], "seq_len": [16], "batch_size": [2]}
        iters, caps = {"iters": [20], "warmup": [3]}, [0, 1, 5, 10, 25, 50, 100, 200]
        allreduce = {"reps": 3, "warmup": 1}
        train_iters = 400
        model_sizes, model_reps = powers_of_two(10, 28), {"reps": 10}  # 1 KiB .. 256 MiB, for the model's fit
    else:
        models, inputs = ["resnet50", "bert-base"], {"image_size": [224], "seq_len": [128], "batch_size": [32]}
        iters, caps = {"iters": [20], "warmup": [5]}, [0, 1, 5, 10, 25, 50, 100, 200]
        allreduce = {"reps": 5, "warmup": 2}
        train_iters = 1000
        model_sizes, model_reps = powers_of_two(10, 30), {"reps": 10}
    # The paper's experiments measure the paper's system rebuilt (ddp_core), named: `run` defaults to PyTorch's DDP.
    common = {"backend": backends, "device": device, "model": models, "impl": ["ddp_core"], **inputs, **iters,
              **({} if gpus else {"threads": [1]})}
    run = Step("run", common)
    steps = {
        "e1_allreduce": Step("allreduce", {"backend": backends, "device": device[0], "world_size": widest,
                                           **allreduce}),
        "e2_overlap": run.with_options(world_size=widest, impl=["ddp_core", "ddp_core_no_overlap"]),
        "e3_bucket_size": run.with_options(world_size=widest, bucket_mb=caps),
        "e4_scaling": run.with_options(world_size=sizes),
        # whole cycles of n: the analysis averages each cycle of n iterations
        "e5_skip_sync": run.with_options(world_size=widest, sync_every=[1, 2, 4, 8],
                                         iters=[40] if profile != "smoke" else [16]),
        "e6_convergence": Step("train", {"backend": backends[-1:], "device": device[0], "world_size": widest,
                                         "sync_every": [1, 2, 4, 8], "iters": train_iters}),
        "e7_round_robin": run.with_options(world_size=widest, process_groups=[1, 3, 5]),
        # The performance model's inputs: a one-process profile and a dense all-reduce sweep. On a CPU
        # the ranks of a run share this host's cores: profile as many copies at once as a run has ranks.
        "model_profile": Step("profile", {"device": device, "model": models, **inputs, **iters,
                                          **({} if gpus else {"threads": [1], "colocated": sizes})}),
        "model_allreduce": Step("allreduce", {"mode": "size", "backend": backends, "device": device[0],
                                              "world_size": widest, "sizes": model_sizes, **model_reps}),
    }
    if not gpus:
        steps.update(link_steps(profile, run))
        steps.update(scale_steps(profile, run, out_dir))
    return steps


# The emulated cluster's links. On 2 cores Gloo's own CPU work caps what a link can carry at about
# 5 Gbit/s (link_fidelity measures it): 2.5gbit is delivered within 10%, 5gbit at about 85%. At the
# quick profile's input sizes communication is then 55-70% of a no-overlap iteration (the report
# states the shares measured). E2 and E3 run at both rates, the rest at the slower one; fewer
# iterations than on loopback, where the link's time is steadier than shared cores.
LINK_RATES = {"smoke": ["1gbit"], "quick": ["2.5gbit", "5gbit"]}
FIDELITY_RATES = {"smoke": ["1gbit"], "quick": ["500mbit", "1gbit", "2.5gbit", "5gbit", "10gbit"]}


def link_steps(profile: str, run: Step) -> dict[str, Step]:
    """Experiment name -> Step for the emulated part: 2 hosts x 1 rank behind links."""
    if profile not in LINK_RATES:
        return {}
    rates = LINK_RATES[profile]
    both = run.with_options(world_size=[2], link=rates)
    slow = run.with_options(world_size=[2], link=rates[:1])
    fidelity = Step("allreduce", {"mode": "size", "world_size": [2], "link": FIDELITY_RATES[profile]})
    if profile == "smoke":
        return {
            "link_fidelity": fidelity.with_options(sizes=[1024, 1048576], reps=3, warmup=1),
            "link_e2_overlap": both.with_options(impl=["ddp_core", "ddp_core_no_overlap"]),
        }
    iters = {"iters": [12], "warmup": [2]}
    return {
        # Bus bandwidth against the configured rate, and the small-message latency the emulation adds
        # (against loopback's: model_allreduce measures the same sizes).
        "link_fidelity": fidelity.with_options(sizes=[4 ** k * 1024 for k in range(9)], reps=5, warmup=2),
        "link_e1_allreduce": Step("allreduce", {"mode": "granularity", "world_size": [2], "link": rates[:1],
                                                "per_call": [10000, 100000, 1000000, 10000000, 60000000],
                                                "reps": 3, "warmup": 1}),
        "link_e2_overlap": both.with_options(**iters, impl=["ddp_core", "ddp_core_no_overlap"]),
        "link_e3_bucket_size": both.with_options(**iters, bucket_mb=[0, 1, 5, 25, 100, 200]),
        "link_e5_skip_sync": slow.with_options(sync_every=[1, 2, 4, 8], iters=[24], warmup=[2]),
        "link_e7_round_robin": slow.with_options(**iters, process_groups=[1, 3, 5]),
        # One host of 2 ranks (unshaped loopback between them) against 2 hosts of 1 rank.
        "link_e4_scaling": slow.with_options(**iters, ranks_per_host=[1, 2]),
    }


# The scale model: ranks with emulated compute on emulated hosts, time dilated by K. The time dilation
# K keeps this 2-core machine's cores at most half busy (the records' cores_busy): K = 50 up to 8 ranks
# (at most 25% busy), K = 100 at 16 ranks, where K = 50 kept them 55% busy and measured 7% slower than
# K = 100 (scale_fidelity measures K = 25, 50, 100). BERT-base stops at 4 ranks: a BERT-base stand-in's
# process peaked at 2.8 GB, so 8 of them need about 22 GB of the 24.
SCALE_DILATION, SIXTEEN_RANK_DILATION = 50, 100
PAPER_CLUSTER = {"link": ["100gbit"], "ranks_per_host": [8]}  # 8 GPUs per server, 100 Gbit/s between


def scale_steps(profile: str, run: Step, out_dir: Path) -> dict[str, Step]:
    """Experiment name -> Step for the scale model; the profiles come from `out_dir`."""
    if profile != "quick":
        return {}
    measured = out_dir / "model_profile.jsonl"
    fresh = [str(out_dir / "scale_profile.jsonl")]  # profiled right before the validation it drives
    gpu = [str(out_dir / "scale_gpu_profile.jsonl")]
    link = {"world_size": [2], "link": ["2.5gbit"], "iters": [10], "warmup": [2]}
    emulated = Step("run", {"impl": ["ddp_core"], "compute": ["emulated"], "compute_profile": gpu, "time_dilation": [SCALE_DILATION],
                            "iters": [4], "warmup": [2], "threads": [1]})
    sixteen = emulated.with_options(world_size=[16], **PAPER_CLUSTER, time_dilation=[SIXTEEN_RANK_DILATION])
    inputs = {k: run.options[k] for k in ("model", "image_size", "seq_len", "batch_size")}
    return {
        # Validation at 2 ranks over one link: emulated against real compute, then K = 1, 2, 4.
        "scale_profile": Step("profile", {"device": ["cpu"], **inputs, "iters": [10], "warmup": [2], "threads": [1],
                                          "colocated": [2]}),
        "scale_validation": run.with_options(**link, impl=["ddp_core", "ddp_core_no_overlap"],
                                             compute=["real", "emulated"], compute_profile=fresh),
        "scale_dilation": run.with_options(**link, compute=["emulated"], compute_profile=fresh,
                                           time_dilation=[1, 2, 4]),
        # Loopback all-reduce at 2-16 ranks: how fast the ranks of one emulated host talk (unshaped).
        "scale_loopback": Step("allreduce", {"mode": "size", "world_size": [2, 4, 8, 16],
                                             "sizes": [1048576, 26214400], "reps": 3, "warmup": 1}),
        "scale_gpu_profile": Step("scale-profile", {"profile": measured, "model": ["resnet50", "bert-base"],
                                                    "gpu": "v100"}),
        "scale_e4_one_host": emulated.with_options(model=["resnet50"], world_size=[1, 2, 4, 8]),
        "scale_e4_bert": emulated.with_options(model=["bert-base"], world_size=[1, 2, 4]),
        "scale_e4_two_hosts": sixteen.with_options(model=["resnet50"]),
        "scale_e3": sixteen.with_options(model=["resnet50"], bucket_mb=[1, 25, 100]),
        "scale_e7": sixteen.with_options(model=["resnet50"], process_groups=[3, 5]),
        # BERT-base where it fits: 4 ranks, one host (E4's 4-rank run is the 25 MB, 1-group point).
        "scale_e3_one_host": emulated.with_options(model=["bert-base"], world_size=[4], bucket_mb=[1, 100]),
        "scale_e7_one_host": emulated.with_options(model=["bert-base"], world_size=[4], process_groups=[3, 5]),
        # The smallest faithful K at 16 ranks: undilated latency against K (the same run at K = 25, 50, 100).
        "scale_fidelity": sixteen.with_options(model=["resnet50"], time_dilation=[25, 50, 100]),
    }


def note_profile(out_dir: Path, experiment: str, profile: str) -> None:
    """Remember in out_dir/profile.json that `experiment` was measured with `profile`."""
    path = out_dir / PROFILE_FILE
    known = json.loads(path.read_text()) if path.exists() else {}
    known[experiment] = profile
    path.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")
