"""`torchvision:NAME`: any classification model of torchvision, random weights, synthetic images.

Detection, segmentation, video, optical-flow and quantized models need other inputs, targets and
losses; they are refused with a message that says so. `--model-config` passes keyword arguments to
torchvision's builder (e.g. `num_classes=10`, `width_mult=0.5`).
"""
from __future__ import annotations

import difflib
import functools

import torch
import torchvision
from torch import nn

from experiments.measure.workloads.base import TORCHVISION, Workload, blame, convert, dry_run

OTHER_KINDS = {"detection": "a detection model", "segmentation": "a segmentation model", "video": "a video model",
               "optical_flow": "an optical-flow model", "quantization": "a quantized model"}


@functools.cache
def classification_models() -> tuple[str, ...]:
    """The names `torchvision.models.list_models()` gives for image classification (the top-level module)."""
    return tuple(torchvision.models.list_models(module=torchvision.models))


def _name(spec: str) -> str:
    name = spec[len(TORCHVISION):]
    if name in classification_models():
        return name
    for module, what in OTHER_KINDS.items():
        if name in torchvision.models.list_models(module=getattr(torchvision.models, module)):
            raise ValueError(f"--model={spec!r} is {what}; torchvision: takes the "
                             f"{len(classification_models())} image classification models (a user file can "
                             "build this one with its own batch and loss, see docs/your-model.md)")
    close = difflib.get_close_matches(name, classification_models(), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(TORCHVISION + c for c in close)}?" if close else ""
    raise ValueError(f"--model={spec!r}: torchvision has no classification model {name!r}{hint} (all of them: "
                     "python -c 'import torchvision; print(torchvision.models.list_models(module=torchvision.models))')")


def _builder_kwargs(name: str, overrides: dict[str, str], image_size: int) -> dict:
    kwargs = {}
    # Vision transformers fix the input size at construction (position embeddings, attention windows).
    if name.startswith("vit_"):
        kwargs["image_size"] = image_size
    elif name.startswith("maxvit_"):
        kwargs["input_size"] = (image_size, image_size)
    kwargs.update({key: convert(key, raw) for key, raw in overrides.items()})
    return kwargs


def make_batch(model: nn.Module, batch_size: int, image_size: int, seq_len: int, generator: torch.Generator,
               num_classes: int = 1000) -> dict:
    """Random images and labels (seq_len is unused here)."""
    return {"images": torch.randn(batch_size, 3, image_size, image_size, generator=generator),
            "labels": torch.randint(0, num_classes, (batch_size,), generator=generator)}


def loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """Cross-entropy of the classifier; GoogLeNet's and Inception's auxiliary heads (training mode) add
    0.4 of theirs, as torchvision's reference scripts do, so that every parameter gets a gradient."""
    output = model(batch["images"])
    if isinstance(output, tuple):  # InceptionOutputs / GoogLeNetOutputs: (logits, aux...)
        main, *aux = (o for o in output if o is not None)
        return nn.functional.cross_entropy(main, batch["labels"]) + 0.4 * sum(
            nn.functional.cross_entropy(a, batch["labels"]) for a in aux)
    return nn.functional.cross_entropy(output, batch["labels"])


def load(spec: str, overrides: dict[str, str], image_size: int, seq_len: int) -> Workload:
    """The Workload of `torchvision:NAME` (ValueError for other kinds and unknown names)."""
    name = _name(spec)
    kwargs = _builder_kwargs(name, overrides, image_size)
    num_classes = kwargs.get("num_classes", 1000)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"--model-config num_classes={overrides['num_classes']!r} is not allowed; it must be an "
                         "integer >= 1")
    return Workload(spec, functools.partial(torchvision.models.get_model, name, weights=None, **kwargs),
                    functools.partial(make_batch, num_classes=num_classes), loss)


def check(spec: str, overrides: dict[str, str], image_size: int, seq_len: int) -> dict:
    """ValueError unless the model builds with these keywords and takes images of `image_size`."""
    workload = load(spec, overrides, image_size, seq_len)
    try:
        parameters = dry_run(workload, image_size, seq_len)
    except TypeError as error:  # an unknown keyword of the builder
        raise ValueError(f"--model-config for {spec!r}: {error}") from None
    except (RuntimeError, ValueError, AssertionError) as error:
        raise ValueError(f"--model={spec!r} with --image-size {image_size}: {str(error).splitlines()[0]} "
                         "(a larger --image-size may fit)") from None
    except Exception as error:  # noqa: BLE001 - KeyError, AttributeError...: a value the builder cannot use
        given = f"--model-config {blame(overrides, error)} for {spec!r}" if overrides else f"--model={spec!r}"
        raise ValueError(f"{given}: the model cannot be built or run: {type(error).__name__}: "
                         f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}") from None
    return {"parameters": parameters, "source_hash": ""}
