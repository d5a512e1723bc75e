"""A plain training loop of the kind users write, traced with torch.profiler for ddpbench (docs/trace.md).

    python examples/trace_my_loop.py --model torchvision:resnet18 --image-size 32 --out /tmp/resnet18.json
    ./ddpbench predict --trace /tmp/resnet18.json --allreduce results/reference/x86_64-2cpu/runs/x86_64-2cpu
    python examples/trace_my_loop.py --model examples/my_model.py --clip 1.0 --accumulate 2 --out /tmp/mine.json
    python examples/trace_my_loop.py --model torchvision:resnet18 --image-size 32 --world-size 2   # the same loop
        # under torch's DDP on this machine (gloo, 2 processes): prints its median iteration, to check a prediction
    python examples/trace_my_loop.py --model torchvision:resnet18 --colocated 2 --out /tmp/resnet18_x2.json
        # trace while a second copy trains beside it, as two ranks sharing this host's cores would
    python examples/trace_my_loop.py --model transformers:gpt2 --batch-size 2 --seq-len 32 --out /tmp/gpt2.json
        # a causal language model of transformers (random weights), trained on random token ids

Nothing here is ddpbench: a DataLoader, a model, cross-entropy (a language model's own loss for
`transformers:TYPE`), optional gradient accumulation and clipping, SGD. The three profiler lines marked PROFILER are all a user adds to their own loop.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def build_model(spec: str, classes: int) -> nn.Module:
    """torchvision:NAME, transformers:TYPE (a causal LM built from its configuration's defaults; both with
    random weights), or a file with build_model() such as examples/my_model.py."""
    if spec.startswith("torchvision:"):
        import torchvision

        return torchvision.models.get_model(spec.split(":", 1)[1], weights=None, num_classes=classes)
    if spec.startswith("transformers:"):
        import transformers

        config = transformers.AutoConfig.for_model(spec.split(":", 1)[1], use_cache=False)
        return transformers.AutoModelForCausalLM.from_config(config)
    module_spec = importlib.util.spec_from_file_location("user_model", spec)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.build_model(classes=classes)


def batches(args, model: nn.Module) -> DataLoader:
    """Random images and labels (token ids for a language model) behind a DataLoader, as a real loop reads
    its data."""
    count = args.batch_size * args.accumulate * (args.steps + 1)
    g = torch.Generator().manual_seed(0)
    if is_language_model(args):
        data = TensorDataset(torch.randint(0, model.config.vocab_size, (count, args.seq_len), generator=g))
        return DataLoader(data, batch_size=args.batch_size, shuffle=True, generator=g)
    data = TensorDataset(torch.randn(count, 3, args.image_size, args.image_size, generator=g),
                         torch.randint(0, args.classes, (count,), generator=g))
    return DataLoader(data, batch_size=args.batch_size, shuffle=True, generator=g)


def is_language_model(args) -> bool:
    """Whether --model is a transformers language model (token ids in, its own loss out)."""
    return args.model.startswith("transformers:")


def compute_loss(model: nn.Module, batch: list, language_model: bool) -> torch.Tensor:
    """Cross-entropy of the class logits; a language model predicts its own tokens (it shifts them inside)."""
    if language_model:
        return model(input_ids=batch[0], labels=batch[0]).loss
    images, labels = batch
    return nn.functional.cross_entropy(model(images), labels)


def train(args, rank: int = 0, world_size: int = 1, profiler=None) -> list[float]:
    """The loop: per step, `accumulate` micro-batches, then clip and step. Returns seconds per step."""
    torch.manual_seed(0)
    model = build_model(args.model, args.classes)
    data = iter(batches(args, model))
    if world_size > 1:
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    language_model = is_language_model(args)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        for micro in range(args.accumulate):
            batch = next(data)
            last = micro == args.accumulate - 1
            # Under DDP, only the last micro-batch all-reduces (no_sync for the others).
            with contextlib.nullcontext() if last or world_size == 1 else model.no_sync():
                loss = compute_loss(model, batch, language_model) / args.accumulate
                loss.backward()
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        if profiler is not None:
            profiler.step()  # PROFILER (2 of 3): mark the end of an iteration
    return times


def _rank(rank: int, world_size: int, args) -> None:
    """One DDP rank on this machine (gloo over loopback)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        times = train(args, rank, world_size)[args.warmup:]
        if rank == 0:
            print(f"{args.model}: {world_size} ranks, median {statistics.median(times) * 1e3:.2f} ms per step "
                  f"over {len(times)} steps (min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f})")
    finally:
        dist.destroy_process_group()


def _copy(index: int, args) -> None:
    """One of --colocated copies: the first traces, the others train beside it (no communication)."""
    torch.set_num_threads(args.threads)
    if index:
        args.steps += 2  # keep the cores busy until the traced copy has finished
        train(args)
        return
    if not torch.cuda.is_available():
        # Not a profiler line of a user's loop: on a machine without a GPU, PyTorch built with CUDA asks the
        # CUDA runtime for its devices to describe them in the trace (`deviceProperties`), even though only
        # CPU activity is recorded, and Kineto logs "ERROR: gpuGetDeviceCount failed with code 35" (no CUDA
        # driver). The trace is whole; level 5 leaves Kineto's errors, warnings and info unprinted.
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    # PROFILER (1 of 3): record shapes (the gradients' sizes); skip a step, warm up one, keep the rest.
    with torch.profiler.profile(record_shapes=True,
                                schedule=torch.profiler.schedule(wait=1, warmup=1, active=args.steps - 2)) as prof:
        train(args, profiler=prof)
    prof.export_chrome_trace(args.out)  # PROFILER (3 of 3): the file ddpbench reads


def main() -> None:
    """Trace the loop for a few steps in one process (or run it under DDP with --world-size)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="examples/my_model.py")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=32, help="tokens per sample (transformers: models)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--clip", type=float, default=0.0, help="clip the gradient norm to this (0: no clipping)")
    parser.add_argument("--threads", type=int, default=1, help="compute threads (ddpbench runs use 1 per rank)")
    parser.add_argument("--steps", type=int, default=7, help="steps to run (traced: wait 1, warm-up 1, 5 active)")
    parser.add_argument("--warmup", type=int, default=3, help="with --world-size: steps left out of the median")
    parser.add_argument("--world-size", type=int, default=1, help="> 1: run under DDP instead of tracing")
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--colocated", type=int, default=1, help="trace while this many copies in all train at once "
                        "(ranks sharing this host compute more slowly than a process alone)")
    parser.add_argument("--out", default="trace.json")
    args = parser.parse_args()
    if args.world_size > 1:
        mp.spawn(_rank, args=(args.world_size, args), nprocs=args.world_size)
        return
    if args.colocated > 1:
        mp.spawn(_copy, args=(args,), nprocs=args.colocated)
    else:
        _copy(0, args)
    print(f"wrote {args.out}; now: ./ddpbench predict --trace {args.out} --allreduce <all-reduce records> "
          "--world-size 2   (docs/trace.md)")


if __name__ == "__main__":
    main()
