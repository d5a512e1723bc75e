"""The user's own workload: a file `path/to/file.py` or an importable module `package.module` defining

    build_model(**model_config) -> torch.nn.Module
    make_batch(model, batch_size, image_size, seq_len, generator) -> dict of str -> torch.Tensor (on the CPU)
    loss(model, batch) -> scalar torch.Tensor    # `model` is the DDP wrapper; call it as the module

as the built-in workloads do (docs/your-model.md; `examples/my_model.py`). `--model-config
key=value,...` becomes keyword arguments of `build_model` (values read as Python literals, else text).
The file's sha256 goes into the record's config (`model_hash`), so that results of two different files
of the same name are never compared.
"""
from __future__ import annotations

import difflib
import functools
import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
import traceback
from pathlib import Path

from experiments.measure.workloads.base import (
    LOSS_CONTRACT,
    MAKE_BATCH_CONTRACT,
    TORCHVISION,
    TRANSFORMERS,
    Workload,
    convert,
    dry_run,
)

FUNCTIONS = ("build_model", "make_batch", "loss")
CONTRACT = (f"build_model(**model_config) -> torch.nn.Module, {MAKE_BATCH_CONTRACT}, {LOSS_CONTRACT} "
            "(docs/your-model.md, examples/my_model.py)")
# How the harness calls them (positionally): the arguments a signature must take.
CALLS = {"make_batch": ("model", "batch_size", "image_size", "seq_len", "generator"), "loss": ("model", "batch")}


def is_file_spec(spec: str) -> bool:
    """A path (ends in .py or holds a slash), as opposed to a module name."""
    return spec.endswith(".py") or "/" in spec


def file_hash(path: Path) -> str:
    """The first 16 hex digits of the sha256 of the file's content."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _unknown(spec: str) -> ValueError:
    from experiments.measure.workloads import WORKLOADS
    from experiments.measure.workloads.torchvision_any import classification_models

    candidates = [*WORKLOADS, *(TORCHVISION + n for n in classification_models())]
    try:
        from transformers import CONFIG_MAPPING

        candidates += [TRANSFORMERS + t for t in CONFIG_MAPPING.keys()]
    except ImportError:
        pass
    bare = {c.split(":", 1)[-1]: c for c in candidates}
    close = [bare[c] for c in difflib.get_close_matches(spec, list(bare), n=3, cutoff=0.7)]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return ValueError(f"--model={spec!r} is not allowed; choose one of {', '.join(sorted(WORKLOADS))}, "
                      f"{TORCHVISION}NAME, {TRANSFORMERS}TYPE, a file path/to/file.py or a module package.module{hint}")


def _import(spec: str):
    """The user's module and the file it came from (ValueError for a missing file or a failed import)."""
    if is_file_spec(spec):
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"--model={spec!r}: no such file{' (it is a folder)' if path.is_dir() else ''}")
        if path.suffix != ".py":  # importlib finds no loader for it; a workload is Python source
            raise ValueError(f"--model={spec!r} is not a Python file (its name must end in .py); a workload file "
                             f"defines {CONTRACT}")
        # A name per content: a changed file is a new module, never the stale one from sys.modules.
        name = f"ddpbench_user_{file_hash(path)}"
        if name in sys.modules:
            return sys.modules[name], path
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # (dataclasses and pickling look the module up by name)
        loader = functools.partial(module_spec.loader.exec_module, module)
    else:
        if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", spec):
            raise _unknown(spec)
        name, path = spec, None
        loader = functools.partial(importlib.import_module, spec)
    try:
        loaded = loader()
    except BaseException as error:  # SyntaxError, ImportError, SystemExit, anything the user's code raises
        sys.modules.pop(name, None)
        if isinstance(error, KeyboardInterrupt):
            raise
        if isinstance(error, ModuleNotFoundError) and path is None and spec.startswith(error.name or "\0"):
            raise ValueError(f"--model={spec!r}: no module named {error.name!r} (a file needs its path, "
                             "ending in .py)") from None
        shown = "".join(traceback.format_exception(error)[-4:]).rstrip()
        raise ValueError(f"--model={spec!r} failed to import:\n{shown}") from None
    module = loaded if path is None else module
    return module, Path(module.__file__) if path is None else path


def load(spec: str, overrides: dict[str, str], image_size: int, seq_len: int) -> Workload:
    """The user's Workload (ValueError naming a missing file, a failed import, a missing function, or a
    `--model-config` key that `build_model` does not take)."""
    module, path = _import(spec)
    missing = [f for f in FUNCTIONS if not callable(getattr(module, f, None))]
    if missing:
        raise ValueError(f"--model={spec!r} lacks {', '.join(missing)}; a workload defines {CONTRACT}")
    for name, arguments in CALLS.items():
        try:
            inspect.signature(getattr(module, name)).bind(*arguments)
        except TypeError as error:
            raise ValueError(f"--model={spec!r}: {name} cannot be called as {name}({', '.join(arguments)}) "
                             f"({error}); a workload defines {CONTRACT}") from None
        except ValueError:
            pass  # no signature to read (a builtin): the dry run calls it
    kwargs = {key: convert(key, raw) for key, raw in overrides.items()}
    try:
        inspect.signature(module.build_model).bind(**kwargs)
    except TypeError as error:
        raise ValueError(f"--model-config for {spec!r}: build_model does not take {sorted(kwargs)}: {error}") from None
    return Workload(spec, functools.partial(module.build_model, **kwargs), module.make_batch, module.loss,
                    source_hash=file_hash(path))


def check(spec: str, overrides: dict[str, str], image_size: int, seq_len: int) -> dict:
    """ValueError unless the workload imports, has its three functions, and, in one dry run on the meta
    device (a batch of 2), returns a dict of tensors from make_batch and a scalar tensor from loss. The
    model is not built for real here (it may need the device of a rank); errors of the user's code on
    the meta device are left to the ranks."""
    workload = load(spec, overrides, image_size, seq_len)
    return {"parameters": dry_run(workload, image_size, seq_len, user_code=True), "source_hash": workload.source_hash}
