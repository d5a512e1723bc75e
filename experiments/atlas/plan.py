"""What the atlas measures: its models (with input sizes this 2-core machine runs in a fraction of a second
per iteration), the DDP options it sets against PyTorch DDP's defaults, and the blocks of variants that one
set of rank processes holds at once. Every check of a request happens here, before any process starts.

A block is a set of variants measured interleaved (interleave.py): one replica of the model per variant on
each rank. Memory bounds how many replicas fit, so a large model's variants are split over several
blocks, each with a default replica of its own: a ratio always compares a variant with the default of its
own block. torch.compile gets a block of its own (with its own default), because its warm-up compiles for
minutes and a model that inductor cannot compile must not cost the other options' measurements.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from experiments.core.config import ConfigError, RunConfig

WORLD_SIZE = 2
DEFAULT = "default"
# PowerSGD's rank: 2, the rank at which Vogels et al. (NeurIPS 2019) matched full-precision accuracy with
# ResNet-18 on CIFAR-10 (PyTorch's own default, 1, compresses more and is less often enough).
POWERSGD_RANK = 2
# variant -> its RunConfig fields that differ from the defaults (PyTorch's DDP, 25 MB buckets, no hook)
VARIANTS: dict[str, dict] = {
    DEFAULT: {},
    "find_unused": {"find_unused_parameters": True},
    "static_graph": {"static_graph": True},
    "bucket_view": {"bucket_view": True},
    "fp16_hook": {"comm_hook": "fp16"},
    "bf16_hook": {"comm_hook": "bf16"},
    "powersgd": {"comm_hook": "powersgd", "powersgd_rank": POWERSGD_RANK},
    "compile": {"compile": "default"},
    "bucket_1mb": {"bucket_mb": 1.0},
    "bucket_5mb": {"bucket_mb": 5.0},
    "bucket_100mb": {"bucket_mb": 100.0},
    # ddp_core (the paper's system rebuilt) at PyTorch's defaults, and ddp_core choosing its own cap while it
    # trains (bucket_cap_mb="auto", which PyTorch's DDP lacks): beside each other they tell what the
    # implementation costs apart from what the choice gains
    "ddp_core": {"impl": "ddp_core"},
    "bucket_auto": {"impl": "ddp_core", "bucket_mb": "auto"},
}
OWN_BLOCK = ("compile",)  # variants measured in a block of their own, against a default of that block
# PowerSGD's state runs plain all-reduce for its first 2 iterations (harness.wrap), and DDP rebuilds its
# buckets after the first: from the third warm-up iteration on, every variant runs as it will be measured.
MIN_WARMUP = 3
MIN_ROUNDS = 3  # rounds are the pairs of the t interval: fewer say nothing
# Memory per parameter of one replica on one rank: weights, gradients, bucket copies and SGD's momentum
# (16 B, as measure.configs counts), plus PowerSGD's error feedback or activations (8 B more).
BYTES_PER_PARAMETER = 24
HARDWARE = ("backend", "device", "threads", "model_hash")  # fields resolve_grid fills in (model_hash: derived)
MEMORY_SHARE = 0.4  # of this machine's memory, by default: it is shared with other work


@dataclass(frozen=True)
class Model:
    """An atlas model: a `--model` spec of `run` with its configuration and input sizes."""

    spec: str
    model_config: str = ""
    image_size: int = 64
    seq_len: int = 32
    batch_size: int = 4

    def fields(self) -> dict:
        """The RunConfig fields of this model."""
        return {"model": self.spec, "model_config": self.model_config, "image_size": self.image_size,
                "seq_len": self.seq_len, "batch_size": self.batch_size}


_SMALL = "num_hidden_layers=4,num_attention_heads=4,hidden_size=256"
# Input sizes chosen so that one training iteration of a single rank takes about 0.1-0.4 s on one core of
# the reference machine (a 2-core x86 VM); transformers at small configurations with their real vocabularies.
MODELS: dict[str, Model] = {
    "resnet18": Model("torchvision:resnet18", batch_size=8),
    "resnet50": Model("torchvision:resnet50"),
    "mobilenet_v3_large": Model("torchvision:mobilenet_v3_large", batch_size=8),
    "efficientnet_b0": Model("torchvision:efficientnet_b0", batch_size=8),
    "convnext_tiny": Model("torchvision:convnext_tiny"),
    "vit_b_16": Model("torchvision:vit_b_16", image_size=32),
    "swin_t": Model("torchvision:swin_t"),
    "bert": Model("transformers:bert", f"{_SMALL},intermediate_size=1024"),
    "distilbert": Model("transformers:distilbert", "dim=256,hidden_dim=1024,n_layers=4,n_heads=4"),
    "gpt2": Model("transformers:gpt2", "n_embd=256,n_layer=4,n_head=4"),
    "t5": Model("transformers:t5", "d_model=256,d_ff=1024,d_kv=64,num_layers=4,num_decoder_layers=4,num_heads=4"),
    "llama": Model("transformers:llama", f"{_SMALL},intermediate_size=688,num_key_value_heads=4"),
    "mistral": Model("transformers:mistral", f"{_SMALL},intermediate_size=688,num_key_value_heads=2"),
}
# --quick: tiny models (a built-in CNN and BERT, a GPT-2 through transformers:), a few rounds.
QUICK_MODELS: dict[str, Model] = {
    "resnet-tiny": Model("resnet-tiny", image_size=16, batch_size=2),
    "bert-tiny": Model("bert-tiny", seq_len=8, batch_size=2),
    "gpt2-tiny": Model("transformers:gpt2", "n_embd=32,n_layer=2,n_head=2,vocab_size=512,bos_token_id=0,eos_token_id=0", seq_len=8, batch_size=2),
}
LINKS = ("none", "1gbit")  # loopback, and 2 emulated hosts behind a 1 Gbit/s link
QUICK = {"rounds": 4, "warmup": MIN_WARMUP}
FULL = {"rounds": 20, "warmup": 4}


@dataclass(frozen=True)
class Block:
    """Variants measured interleaved in one set of replicas, for one model on one network."""

    model: str  # the atlas's name of the model
    link: str
    name: str  # `main`, `main-2`, ... or an own-block variant's name
    configs: dict[str, RunConfig]  # variant -> its config; the default first


def parse_names(flag: str, text: str, known) -> list[str]:
    """A comma-separated list of names from `known`, in the given order; ConfigError naming the unknown."""
    names = [n.strip() for n in text.split(",")]
    unknown = [n for n in names if n not in known]
    if unknown or not all(names):
        raise ConfigError(f"--{flag}={text!r}: {', '.join(map(repr, unknown)) or 'an empty name'} is not allowed; "
                          f"choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


def variant_config(model: Model, variant: str, link: str, rounds: int, warmup: int) -> RunConfig:
    """The RunConfig of one variant: PyTorch's DDP (unless the variant names another impl) at world size 2
    with the variant's options; `iters` counts the rounds (one measured iteration each), `warmup` the
    iterations before them (bucket_auto: after the iterations in which ddp_core chooses its cap)."""
    return RunConfig(**{**model.fields(), "impl": "torch", "world_size": WORLD_SIZE, "link": link, "iters": rounds,
                        "warmup": warmup, **VARIANTS[variant]})


def parameters(config: RunConfig) -> int:
    """The model's parameter count, from a build on the meta device (no memory, no time)."""
    from experiments.measure.configs import model_info

    known = model_info(config)["parameters"]  # (also refuses a model that cannot be built: ConfigError)
    if known is not None:
        return known
    import torch

    from experiments.measure.workloads.spec import load

    with torch.device("meta"):  # a built-in model: its builder is plain PyTorch
        model = load(config.model, config.model_config, config.image_size, config.seq_len).build()
    return sum(p.numel() for p in model.parameters())


def default_memory_gb() -> float:
    """The memory the atlas's replicas may take by default: MEMORY_SHARE of this machine's."""
    return MEMORY_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def replicas_that_fit(model_name: str, params: int, memory_gb: float) -> int:
    """How many replicas (variants) of a model of `params` parameters the ranks of this machine hold within
    `memory_gb`; ConfigError if not even a default and one option fit."""
    per_variant = params * BYTES_PER_PARAMETER * WORLD_SIZE
    fit = int(memory_gb * 2**30 // per_variant)
    if fit < 2:
        raise ConfigError(f"--memory-gb={memory_gb:g} is too little for {model_name} ({params / 1e6:.1f} M parameters): "
                          f"a block holds the default and one option, {2 * per_variant / 2**30:.1f} GiB on "
                          f"{WORLD_SIZE} ranks; allow more, or leave the model out of --models")
    return fit


def split(variants: list[str], capacity: int) -> list[list[str]]:
    """The blocks of the main variants: each holds the default and at most `capacity` - 1 options; as few
    blocks as fit, as even as possible, in the given order."""
    others = [v for v in variants if v != DEFAULT and v not in OWN_BLOCK]
    if not others:
        return []
    count = math.ceil(len(others) / (capacity - 1))
    size, extra = divmod(len(others), count)
    blocks, start = [], 0
    for index in range(count):
        end = start + size + (index < extra)
        blocks.append([DEFAULT, *others[start:end]])
        start = end
    return blocks


def plan(models: dict[str, Model], variants: list[str], links: list[str], rounds: int, warmup: int,
         memory_gb: float) -> list[Block]:
    """Every block to measure, network by network (one set of rank processes each), model by model; each
    config validated as `run` validates it (ConfigError names what is wrong), nothing started."""
    from experiments.measure.configs import check_network_available, resolve_grid

    if rounds < MIN_ROUNDS:
        raise ConfigError(f"--rounds={rounds} is not allowed; it must be >= {MIN_ROUNDS} (the rounds are the pairs "
                          "of each ratio's interval)")
    if warmup < MIN_WARMUP:
        raise ConfigError(f"--warmup={warmup} is not allowed; it must be >= {MIN_WARMUP} (PowerSGD compresses "
                          "from its third iteration, and DDP rebuilds its buckets after the first)")
    if not (memory_gb > 0 and math.isfinite(memory_gb)):
        raise ConfigError(f"--memory-gb={memory_gb} is not allowed; it must be a finite number > 0")
    if not [v for v in variants if v != DEFAULT]:
        raise ConfigError(f"--variants={','.join(variants)!r} holds no option to compare with the default; choose "
                          f"from {', '.join(v for v in VARIANTS if v != DEFAULT)}")
    blocks = []
    for link in links:
        for name, model in models.items():
            configs = {v: variant_config(model, v, link, rounds, warmup) for v in VARIANTS}
            # run's checks (values, the model builds and takes its inputs, memory), and its defaults that
            # depend on the hardware (backend, device, threads: the cores shared among the ranks)
            resolved = {v: resolve_grid({k: [x] for k, x in dataclasses.asdict(c).items() if k not in HARDWARE})[0]
                        for v, c in configs.items()}
            capacity = replicas_that_fit(name, parameters(resolved[DEFAULT]), memory_gb)
            groups = split(variants, capacity)
            for index, group in enumerate(groups):
                label = "main" if len(groups) == 1 else f"main-{index + 1}"
                blocks.append(Block(name, link, label, {v: resolved[v] for v in group}))
            for own in (v for v in variants if v in OWN_BLOCK):
                blocks.append(Block(name, link, own, {DEFAULT: resolved[DEFAULT], own: resolved[own]}))
    try:
        check_network_available([c for b in blocks for c in b.configs.values()])
    except ConfigError as error:
        raise ConfigError(f"--links={','.join(links)}: {error}; `--links none` measures loopback only") from None
    return blocks


def expected_options(config: RunConfig) -> dict:
    """What the variant's DDP must report for `config` (interleave.observe reads it from the live module)."""
    hooks = {"none": "none", "fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook",
             "allreduce": "allreduce_hook", "powersgd": "powerSGD_hook"}
    return {"impl": config.impl, "find_unused_parameters": config.find_unused_parameters, "static_graph": config.static_graph,
            "gradient_as_bucket_view": config.bucket_view, "bucket_cap_mb": config.bucket_mb,
            "comm_hook": hooks[config.comm_hook],
            "powersgd_rank": config.powersgd_rank if config.comm_hook == "powersgd" else None,
            "compiled": config.compile != "none"}
