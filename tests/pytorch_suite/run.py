"""Run PyTorch's shipped DDP tests (tests/pytorch_suite/driver.py) under PyTorch's DDP or ddp_core.

`run_tests` runs the named tests in a pytest of their own (PyTorch's test base reads its settings from
the environment at import) and returns each one's outcome. Run as a script, it regenerates
`expected.json`: which of the DDP tests in `torch.testing._internal.distributed.distributed_test` run
on this CPU with Gloo and 2 ranks and pass with PyTorch's DDP, and how each fares with ddp_core swapped
in. tests/test_pytorch_ddp_suite.py holds ddp_core to that file.

    source scripts/env.sh && python -m tests.pytorch_suite.run     # about 30 minutes on 2 cores
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXPECTED = HERE / "expected.json"
CLASS = "TestPyTorchDDPSuite"
# A test of PyTorch's distributed test base is a DDP test if it, or a helper it calls, builds a
# DistributedDataParallel (the base also tests collectives, RPC, SyncBatchNorm's conversion, ...).
DDP_MENTION = re.compile(r"DistributedDataParallel")


def ddp_test_names() -> list[str]:
    """The DDP tests of the installed torch's distributed_test module, in file order."""
    import torch.testing._internal.distributed as package

    source = (Path(package.__file__).parent / "distributed_test.py").read_text()
    tree = ast.parse(source)
    base = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "_DistTestBase")
    methods = {m.name: ast.get_source_segment(source, m) for m in base.body if isinstance(m, ast.FunctionDef)}

    def mentions_ddp(name: str, seen: set[str]) -> bool:
        seen.add(name)
        body = re.sub(r"#.*", "", methods[name])
        return bool(DDP_MENTION.search(body)) or any(
            callee in methods and callee not in seen and mentions_ddp(callee, seen)
            for callee in re.findall(r"self\.(_\w+)\(", body))

    return [name for name in methods
            if name.startswith("test_") and mentions_ddp(name, set())]


def run_tests(implementation: str, names: list[str], timeout_s: float) -> dict[str, dict]:
    """Run `names` with DDP = `implementation` ("torch" or "ddp_core"); name -> {"outcome", "message", "seconds"}.
    A test that does not report (the run timed out) is "missing"."""
    with tempfile.TemporaryDirectory(prefix="ddpbench-pytorch-suite-") as tmp:
        junit = Path(tmp) / "junit.xml"
        ids = [f"{HERE / 'driver.py'}::{CLASS}::{name}" for name in names]
        env = dict(os.environ, DDPBENCH_DDP=implementation, TMPDIR=tmp)
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *ids]
        try:
            subprocess.run(command, cwd=ROOT, env=env, timeout=timeout_s, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            pass
        results = _parse_junit(junit) if junit.exists() else {}
    return {name: results.get(name, {"outcome": "missing", "message": "no result (timed out?)", "seconds": None})
            for name in names}


def _parse_junit(path: Path) -> dict[str, dict]:
    results = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            element = case.find(tag)
            if element is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                text = (element.get("message") or element.text or "").strip()
                message = text.splitlines()[0][:300] if text else ""
                break
        results[case.get("name")] = {"outcome": outcome, "message": message, "seconds": float(case.get("time", 0))}
    return results


def main() -> int:
    """Regenerate expected.json (PyTorch's DDP first, then ddp_core on the tests that pass with it)."""
    names = ddp_test_names()
    started = time.perf_counter()
    on_torch = run_tests("torch", names, timeout_s=7200)
    passed = [n for n in names if on_torch[n]["outcome"] == "passed"]
    on_ddp_core = run_tests("ddp_core", passed, timeout_s=3600)
    expected = {
        "torch": torch.__version__,
        "command": "source scripts/env.sh && python -m tests.pytorch_suite.run",
        "setting": "Gloo, 2 ranks, CPU (BACKEND=gloo WORLD_SIZE=2)",
        "wall_s": round(time.perf_counter() - started),
        "with_torch_ddp": {n: on_torch[n]["outcome"] for n in names},
        "skip_reasons": {n: on_torch[n]["message"] for n in names if on_torch[n]["outcome"] == "skipped"},
        "with_ddp_core": {n: {k: v for k, v in on_ddp_core[n].items() if k != "seconds"} for n in passed},
    }
    EXPECTED.write_text(json.dumps(expected, indent=1) + "\n")
    counts = {o: sum(1 for r in on_ddp_core.values() if r["outcome"] == o) for o in ("passed", "failed", "missing")}
    print(f"{len(names)} DDP tests; {len(passed)} pass with PyTorch's DDP here; with ddp_core: {counts}; "
          f"written to {EXPECTED}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
