"""The layout's rules, checked from the source: every import arrow inside `experiments/` points one way
(cli -> uses -> emulate -> core), nothing imports the CLI, and there is no import circle - lazy imports
inside functions included, since a circle hidden by one is still a circle; results/ holds no program;
and docs/architecture.md names every ddp_core module, and only modules that exist."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "experiments"
# Layer of each top-level part; a module may import only its own layer's or lower layers' modules.
LAYERS = {"core": 0, "emulate": 1, "measure": 2, "args": 1, "regression": 4, "perfmodel": 4, "atlas": 4, "report": 4,
          "cli": 5, "__main__": 6}
# The uses are side by side: each may build on measuring (it runs workloads), never on another use.
USES = ("regression", "perfmodel", "atlas", "report")
FORBIDDEN = {("measure", use) for use in USES} | {(a, b) for a in USES for b in USES if a != b}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every experiments.* module `path` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("experiments"):
            assert node.level == 0, f"{path}: relative import; the suite imports absolutely"
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("experiments"))
    return found


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(f) for f in FILES}
GRAPH = {module_name(f): imports_of(f) & MODULES for f in FILES}


def part(module: str) -> str:
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def test_nothing_imports_the_cli():
    importers = [m for m, deps in GRAPH.items() if "experiments.cli" in deps and m != "experiments.__main__"]
    assert not importers, f"the CLI is wiring only; these import it: {importers}"


def test_arrows_point_one_way():
    wrong = []
    for module, deps in GRAPH.items():
        for dep in deps:
            a, b = part(module), part(dep)
            if a == "__init__" or b == "__init__" or a == b:
                continue
            if LAYERS[b] > LAYERS[a] or (a, b) in FORBIDDEN:
                wrong.append(f"{module} -> {dep}")
    assert not wrong, "imports against the layering (cli -> uses -> emulate -> core):\n" + "\n".join(sorted(wrong))


def test_the_suite_imports_nothing_from_analysis():
    """analysis/ reads results and draws; the suite and ddp_core must not need it (what both need lives
    in experiments.core)."""
    wrong = []
    for path in [*FILES, *sorted((ROOT / "ddp_core").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            wrong += [f"{path.relative_to(ROOT)} -> {name}" for name in names if name.split(".")[0] == "analysis"]
    assert not wrong, "imports of analysis/ from the suite:\n" + "\n".join(wrong)


def test_no_import_circles():
    state, stack, circles = {}, [], []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for dep in sorted(GRAPH.get(module, ())):
            # a package's __init__ imported for a submodule is not an edge of its own
            if dep == module:
                continue
            if state.get(dep) == "open":
                circles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[module] = "done"

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_core_knows_no_argparse_nor_processes():
    # (asking torch.distributed inside a function whether a backend exists is allowed: it starts nothing)
    for f in (PACKAGE / "core").glob("*.py"):
        tree = ast.parse(f.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert "argparse" not in names, f"{f.name}: core parses no command line"
        top = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        top |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
        assert not any(n.startswith("torch.distributed") for n in top), f"{f.name}: core starts no process group"


def test_no_program_is_filed_among_the_results():
    """results/ holds what was measured; the programs that measure or tabulate live in benchmarks/ or
    the suite, where they are read, tested and found."""
    programs = [str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("*")
                if p.is_file() and (p.suffix in (".py", ".sh") or p.stat().st_mode & 0o111)]
    assert not programs, f"programs under results/: {programs}"


DDP_CORE_MODULES = {p.name for p in (ROOT / "ddp_core").glob("*.py") if p.name != "__init__.py"}
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()


def _section(page: str, title: str) -> str:
    """The text of the `## title` section of `page`, up to the next `## ` heading."""
    start = page.index(f"\n## {title}\n")
    end = page.find("\n## ", start + 1)
    return page[start:end if end != -1 else len(page)]


def test_the_architecture_page_lists_every_ddp_core_module_and_no_other():
    """The layout's ddp_core block names one module per line, indented under `ddp_core/`: exactly the
    files there (a module added, moved or removed without the page fails here)."""
    lines = _section(ARCHITECTURE, "Layout").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ddp_core/"))
    block = []
    for line in lines[start + 1:]:
        if not line.startswith(" "):  # the next top-level entry (experiments/)
            break
        block.append(line)
    named = [m.group(1) for line in block if (m := re.match(r"\s+(\w+\.py)\b", line))]
    assert len(named) == len(set(named)), f"named twice in the layout: {sorted(n for n in named if named.count(n) > 1)}"
    assert set(named) - DDP_CORE_MODULES == set(), "the layout names ddp_core modules that do not exist"
    assert DDP_CORE_MODULES - set(named) == set(), "ddp_core modules missing from docs/architecture.md's layout"


def test_the_pages_name_only_ddp_core_files_that_exist():
    """Every `ddp_core/<file>.py` in the docs and README, and every file the architecture page's
    "Inside ddp_core" section names, exists (a mechanism's file must be where the page says)."""
    pages = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    wrong = [f"{page.relative_to(ROOT)}: ddp_core/{name}" for page in pages
             for name in re.findall(r"ddp_core/(\w+\.py)", page.read_text()) if name not in DDP_CORE_MODULES]
    inside = set(re.findall(r"\b(\w+\.py)\b", _section(ARCHITECTURE, "Inside ddp_core")))
    wrong += [f"docs/architecture.md, Inside ddp_core: {name}" for name in sorted(inside - DDP_CORE_MODULES)]
    assert not wrong, "files named in the pages that ddp_core does not have:\n" + "\n".join(wrong)
