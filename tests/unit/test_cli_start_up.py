"""The command line starts in well under a second: parsing imports nothing heavy (torch, transformers,
pandas, matplotlib, scipy take seconds; the sub-commands import them when they run), the names its help
lists agree with the modules that own them, bad input still exits 2 with argparse's message, and
`pip install -e .` packages everything `ddpbench` imports. (benchmarks/cli_start_up.py times it.)"""
import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = {"torch", "transformers", "pandas", "matplotlib", "scipy"}


def _python(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_building_the_parser_imports_nothing_heavy():
    done = _python("-c", "import experiments.cli, sys; experiments.cli.build_parser(); "
                         f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(HEAVY)}))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_torchvision_model_does_not_import_transformers():
    # Every rank pays the import: transformers took 3.4 s here, beside torch's 1.5-2.5 s. (The other way
    # round there is nothing to save: transformers imports torchvision itself.)
    done = _python("-c", "import sys; from experiments.measure.workloads.spec import load; "
                         "load('resnet-tiny'); print('transformers' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("argv, message", [
    (["run", "--bad-flag"], "ddpbench run: error: the following arguments are required: --out"),
    (["run", "--out", "x.jsonl", "--bad-flag"], "ddpbench run: error: unrecognized arguments: --bad-flag"),
])
def test_a_bad_flag_still_exits_2_with_the_sub_commands_usage(argv, message):
    done = _python("-m", "experiments", *argv)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: ddpbench run ") and done.stderr.rstrip().endswith(message), done.stderr
    assert done.stdout == ""


def test_the_names_the_help_lists_are_the_modules_own():
    from ddp_core.hooks import HOOKS
    from experiments.core.config import HOOK_NAMES
    from experiments.measure.workloads import WORKLOADS, bert, resnet

    assert list(HOOK_NAMES) == list(HOOKS)
    assert WORKLOADS == {name: family.__name__.rsplit(".", 1)[-1] for family in (resnet, bert)
                         for name in family.MODELS}


def _top_level_imports(folder: Path) -> set[str]:
    names = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def test_the_installed_package_holds_what_ddpbench_imports():
    """`pip install -e .` maps only the listed packages: one the suite imports (analysis, for
    `ddpbench report`) but the list lacks fails in the console script alone, not in ./ddpbench."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    module, _, function = project["project"]["scripts"]["ddpbench"].partition(":")
    entry = ast.parse((ROOT / Path(*module.split("."))).with_suffix(".py").read_text())
    assert function in {node.name for node in entry.body if isinstance(node, ast.FunctionDef)}
    own = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}  # the clone's packages
    needed = (_top_level_imports(ROOT / "experiments") | {"analysis"}) & own  # report runs analysis.report by name
    included = {pattern.rstrip("*") for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert needed <= included, f"missing from [tool.setuptools.packages.find] include: {sorted(needed - included)}"
