"""Why a process's first model trains slower: page faults per iteration, first model against later ones.

    source scripts/env.sh && python benchmarks/first_model_page_faults.py > results/reference/x86_64-2cpu/benchmarks/first_model_page_faults.txt

One process, one thread, no DDP: it builds a model, trains it for `--iters` iterations (SGD, gradients set
to None after each step, as PyTorch's default), frees it, and does the same twice more. Per build it prints
the median iteration and the median minor page faults per iteration (`getrusage`), after 3 warm-up
iterations. On glibc's malloc, a fresh process hands large freed blocks back to the kernel, so every
iteration faults its gradients' and activations' pages in again; once a model has been built and freed,
those allocations are served from memory the process already holds. `ddpbench` sweeps therefore run a
fresh pool's first config once unrecorded (experiments/measure/sweep.py), so that every recorded config
meets the same, settled state - which a user's own job, one model in a fresh process, does not reach.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch


def build(spec: str) -> torch.nn.Module:
    """torchvision:NAME with random weights (ViT at 32 px, as the interference validation runs it)."""
    import torchvision

    name = spec.split(":", 1)[1]
    extra = {"image_size": 32} if name.startswith("vit_") else {}
    return torchvision.models.get_model(name, weights=None, **extra)


def train(spec: str, iters: int, warmup: int = 3) -> tuple[float, int]:
    """Median seconds and minor page faults per iteration of a freshly built model, after `warmup`."""
    torch.manual_seed(0)
    model = build(spec)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    images, labels = torch.randn(4, 3, 32, 32), torch.randint(0, 1000, (4,))
    seconds, faults = [], []
    for _ in range(warmup + iters):
        before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return statistics.median(seconds[warmup:]), int(statistics.median(faults[warmup:]))


def main() -> None:
    """Print one line per build: which build, median ms and minor faults per iteration."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="torchvision:vit_b_16")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--builds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"# python benchmarks/first_model_page_faults.py --model {args.model} --iters {args.iters} "
          f"(torch {torch.__version__}, 1 thread, batch 4, 32 px)")
    for index in range(args.builds):
        seconds, faults = train(args.model, args.iters)
        print(f"build {index + 1}: median {seconds * 1e3:.1f} ms per iteration, {faults} minor page faults per "
              f"iteration ({faults * resource.getpagesize() / 1e6:.0f} MB of pages)")


if __name__ == "__main__":
    main()
