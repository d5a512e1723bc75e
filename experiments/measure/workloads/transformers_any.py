"""`transformers:TYPE`: a model type of transformers' configuration registry (`gpt2`, `llama`, `t5`, `vit`,
...), built from its configuration class's defaults with random weights; nothing is downloaded.

`--model-config key=value,...` overrides fields of the configuration (also their common aliases, such
as `hidden_size` for GPT-2's `n_embd`); values take the type of the field's default. The head follows
the kind of model, in this order: sequence-to-sequence LM for encoder-decoder models, masked LM,
causal LM, image classification. Text models get random token ids of `--seq-len`, image models
random images of `--image-size` (which also sets the configuration's `image_size`, where it has one,
unless `--model-config` sets it).
"""
from __future__ import annotations

import difflib
import functools

import torch
from torch import nn

from experiments.measure.workloads.base import TRANSFORMERS, Workload, blame, convert, dry_run

# (head, the auto-class mapping that names it), in the order of preference described above
HEADS = (("seq2seq", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"), ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
         ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
         ("image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"))


def _config_class(spec: str):
    from transformers import CONFIG_MAPPING

    model_type = spec[len(TRANSFORMERS):]
    if model_type not in CONFIG_MAPPING:
        close = difflib.get_close_matches(model_type, list(CONFIG_MAPPING.keys()), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(TRANSFORMERS + c for c in close)}?" if close else ""
        raise ValueError(f"--model={spec!r}: transformers has no model type {model_type!r}{hint} (all of them: "
                         "python -c 'from transformers import CONFIG_MAPPING; print(list(CONFIG_MAPPING))')")
    return model_type, CONFIG_MAPPING[model_type]


def head_of(model_type: str, config) -> tuple[str, str]:
    """The head (kind, class name) for `model_type`, in the order of HEADS; ValueError if it has none."""
    from transformers.models.auto import modeling_auto

    for head, mapping in HEADS:
        names = getattr(modeling_auto, mapping)
        if model_type in names and (head != "seq2seq" or config.is_encoder_decoder):
            return head, names[model_type]
    raise ValueError(f"--model='{TRANSFORMERS}{model_type}' has no {', '.join(h for h, _ in HEADS)} head among "
                     "transformers' auto classes; for another kind of model, write a user file "
                     "(docs/your-model.md)")


def make_config(spec: str, overrides: dict[str, str], image_size: int):
    """The configuration: the class's defaults, `overrides` converted to each field's type, no KV cache
    (training), and `image_size` for vision models; ValueError for a field the class does not have."""
    model_type, config_class = _config_class(spec)
    try:
        defaults = config_class()
    except Exception as error:  # composite configs (encoder-decoder, ...) need sub-configurations
        raise ValueError(f"--model={spec!r}: transformers cannot build {config_class.__name__} from its defaults "
                         f"({error}); write a user file for it (docs/your-model.md)") from None
    fields = set(defaults.to_dict()) | set(getattr(defaults, "attribute_map", {}))
    kwargs = {}
    for key, raw in overrides.items():
        if key not in fields or key.startswith("_"):
            close = difflib.get_close_matches(key, sorted(fields), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"--model-config: {config_class.__name__} has no field {key!r}{hint}")
        kwargs[key] = convert(key, raw, getattr(defaults, key))
    if "use_cache" in fields:
        kwargs.setdefault("use_cache", False)
    if isinstance(getattr(defaults, "image_size", None), int):
        kwargs.setdefault("image_size", image_size)
    try:
        return model_type, config_class(**kwargs)
    except Exception as error:  # noqa: BLE001 - ValueError, TypeError, huggingface_hub strict-dataclass errors
        raise ValueError(f"--model-config {blame(overrides, error)} for {spec!r}: the configuration refuses it: "
                         f"{type(error).__name__}: {_first_line(error)}") from None


def make_batch(model: nn.Module, batch_size: int, image_size: int, seq_len: int, generator: torch.Generator,
               head: str = "causal-lm") -> dict:
    """Random inputs and labels for `head`: token ids of `seq_len`, or images of `image_size`."""
    config = model.config
    if head == "image-classification":
        return {"pixel_values": torch.randn(batch_size, getattr(config, "num_channels", 3), image_size, image_size,
                                            generator=generator),
                "labels": torch.randint(0, config.num_labels, (batch_size,), generator=generator)}
    vocab = config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (batch_size, seq_len), generator=generator)
    if head == "seq2seq":  # decoder inputs given, not shifted from labels: not every config names a start token
        return {"input_ids": ids, "decoder_input_ids": torch.randint(0, vocab, (batch_size, seq_len), generator=generator),
                "labels": torch.randint(0, vocab, (batch_size, seq_len), generator=generator)}
    # Causal and masked LM: predict the tokens themselves (a causal LM shifts them inside).
    return {"input_ids": ids, "labels": ids.clone()}


def loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """The loss transformers computes from the labels."""
    return model(**batch).loss


def load(spec: str, overrides: dict[str, str], image_size: int, seq_len: int) -> Workload:
    """The Workload of `transformers:TYPE` (ValueError naming an unknown type, field or missing head)."""
    import transformers

    model_type, config = make_config(spec, overrides, image_size)
    head, class_name = head_of(model_type, config)
    positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    if head != "image-classification" and isinstance(positions, int) and seq_len > positions:
        raise ValueError(f"--seq-len={seq_len} is more than {spec}'s max_position_embeddings={positions}; lower "
                         "--seq-len or raise it with --model-config")
    model_class = getattr(transformers, class_name)
    return Workload(spec, functools.partial(model_class, config), functools.partial(make_batch, head=head), loss)


def check(spec: str, overrides: dict[str, str], image_size: int, seq_len: int) -> dict:
    """ValueError unless the model builds and computes its loss on inputs of these sizes (on the meta device);
    a failure names the `--model-config` values it points at (a value the model cannot use, e.g.
    activation_function=x, fails only when the model is built, as a KeyError deep inside transformers)."""
    workload = load(spec, overrides, image_size, seq_len)
    try:
        parameters = dry_run(workload, image_size, seq_len)
    except Exception as error:  # noqa: BLE001 - whatever transformers raises for a value its model cannot use
        shown = f"{type(error).__name__}: {_first_line(error)}"
        if overrides:
            raise ValueError(f"--model-config {blame(overrides, error)} for {spec!r}: the model cannot be built or "
                             f"run with it (--image-size {image_size}, --seq-len {seq_len}): {shown}") from None
        raise ValueError(f"--model={spec!r} (--image-size {image_size}, --seq-len {seq_len}) does not build or run: "
                         f"{shown}") from None
    return {"parameters": parameters, "source_hash": ""}


def _first_line(error: BaseException) -> str:
    """The first line of the error's text, and of its cause's where it only announces it ("...:")."""
    lines = str(error).strip().splitlines()
    line = lines[0] if lines else ""
    if (not line or line.endswith(":")) and error.__cause__ is not None:
        line = f"{line} {_first_line(error.__cause__)}".strip()
    return line
