"""Packaging: what ``import tfgraph`` pulls in, the installed package list, the entry points."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tfgraph

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent


def test_import_tfgraph_needs_no_back_end_library() -> None:
    code = (
        "import sys, tfgraph, tfgraph.cli, tfgraph.exporters\n"
        "heavy = sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'graphviz', 'matplotlib')"
        " if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == ""


def test_a_yaml_spec_command_imports_no_hugging_face_reader() -> None:
    """``plan`` / ``report`` on a YAML spec start without tfgraph.hf and the numpy it pulls in
    (about 0.3 s of a ``plan --search`` command's 2 s goal, benchmarks/plan_search.py)."""
    code = (
        "import sys\n"
        "from tfgraph.cli import main\n"
        f"main(['plan', {str(ROOT / 'specs' / 'tiny-llama.yaml')!r}, '--gpus', '1', '--json'],"
        " standalone_mode=False)\n"
        "print(','.join(m for m in ('tfgraph.hf', 'numpy') if m in sys.modules),"
        " file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stderr.strip() == ""


def test_public_api() -> None:
    assert {"Spec", "load_spec", "__version__"} <= set(dir(tfgraph))
    assert tfgraph.__version__.count(".") >= 2
    spec = tfgraph.load_spec(ROOT / "specs" / "tiny.yaml")
    assert isinstance(spec, tfgraph.Spec)


def _package_dirs() -> set[str]:
    """Every folder with an __init__.py, named as it is installed."""
    found = set()
    for top, installed in (("tfgraph", "tfgraph"), ("exporters", "tfgraph.exporters")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top).parts
            found.add(".".join((installed, *rel)))
    return found


def test_every_package_folder_is_installed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"]["tfgraph.exporters"] == "exporters"
    missing = _package_dirs() - set(config["packages"])
    assert not missing, f"add {sorted(missing)} to [tool.setuptools] packages in pyproject.toml"


def test_console_script_points_at_the_click_group() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["tfgraph"] == "tfgraph.cli:main"
    assert {"test"} <= set(project["optional-dependencies"])


def test_python_dash_m_tfgraph(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tfgraph", "--version"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.strip() == f"tfgraph, version {tfgraph.__version__}"


# ---- layering ----------------------------------------------------------------------------------

HEAVY = ("torch", "onnx", "onnxruntime", "graphviz", "matplotlib")


def _core_modules() -> list[str]:
    """Every module of tfgraph/ as installed (tfgraph.x, tfgraph.commands.y), but __main__,
    which runs the CLI when imported."""
    names = []
    for path in sorted((ROOT / "tfgraph").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_core_module_imports_without_back_end_libraries() -> None:
    """README.md, "How it works": tfgraph/ (spec, IR, ops, lowering, passes, cost, report, CLI) needs neither
    torch, onnx nor graphviz. Catches a module-level ``import torch`` (or an import of a
    back end) in any core module, not only in the package's __init__."""
    modules = _core_modules()
    assert {"tfgraph.passes.cost", "tfgraph.passes.liveness", "tfgraph.passes.formulas", "tfgraph.passes.compare",
            "tfgraph.passes.report", "tfgraph.io", "tfgraph.commands.run"} <= set(modules)
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    assert proc.stdout.strip() == ""


def _module_files() -> dict[str, Path]:
    """Installed module name -> source file, for tfgraph/ and exporters/ (installed as
    tfgraph.exporters, pyproject's package-dir)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    files: dict[str, Path] = {}
    for package, folder in config["package-dir"].items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join((package, *parts))] = path
    return files


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def import_graph(files: dict[str, Path]) -> Any:
    """Module -> module edges for every import in ``files`` (module level, inside functions,
    under TYPE_CHECKING, ``importlib.import_module("literal")`` and any string that is a
    module's full name, as the lazy tables of ``__getattr__`` hold), restricted to the
    modules of ``files``. Each edge keeps the import lines ("file:line: text") behind it.
    ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to pkg;
    the bare name ``exporters`` is read as its installed name ``tfgraph.exporters``."""
    import ast

    import networkx as nx

    def known(name: str) -> str | None:
        parts = name.split(".")
        while parts:
            if ".".join(parts) in files:
                return ".".join(parts)
            parts.pop()
        return None

    def installed(name: str) -> str:
        return "tfgraph." + name if name == "exporters" or name.startswith("exporters.") \
            else name

    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [installed(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the module's package, up level - 1
                    base = module.split(".") if _is_package(path) else module.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = installed(node.module or "")
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in files else source
                           for a in node.names]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "import_module" and node.args
                  and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)):
                targets = [installed(node.args[0].value)]
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and installed(node.value) in files and "." in node.value):
                # A module's name as a string, e.g. a lazy table's value that
                # ``importlib.import_module(TABLE[name])`` imports on first use.
                targets = [installed(node.value)]
            for target in targets:
                dest = known(target)
                if dest is None or dest == module:
                    continue
                if not graph.has_edge(module, dest):
                    graph.add_edge(module, dest, lines=[])
                where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}"
                graph.edges[module, dest]["lines"].append(
                    f"{where}:{node.lineno}: {ast.unparse(node)}")
    return graph


def _describe_cycles(graph: Any) -> list[str]:
    import networkx as nx

    out = []
    for found in sorted(nx.simple_cycles(graph), key=lambda c: (len(c), sorted(c))):
        start = found.index(min(found))  # one rotation whatever order networkx walked in
        cycle = found[start:] + found[:start]
        hops = [" -> ".join([*cycle, cycle[0]])]
        for a, b in zip(cycle, [*cycle[1:], cycle[0]]):
            hops += [f"    {line}" for line in graph.edges[a, b]["lines"]]
        out.append("\n".join(hops))
    return out


def test_the_package_has_no_import_cycles() -> None:
    """Every import inside tfgraph/ and exporters/, deferred ones included: a cycle works
    today only by the accident of which import runs first (the layering of
    tfgraph.compiler's docstring: tensor <- ops <- ir <- lower <- passes <- compiler, back
    ends on top). Catches any new cycle, and lists the import lines that form it."""
    files = _module_files()
    assert {"tfgraph.graph.ir", "tfgraph.passes.liveness", "tfgraph.exporters.torch.module",
            "tfgraph.exporters.onnx.writer"} <= set(files)
    graph = import_graph(files)
    # The graph is the real one: deferred imports inside functions are in it.
    assert graph.has_edge("tfgraph.exporters.onnx.graph", "tfgraph.version")  # in a function
    assert graph.has_edge("tfgraph.commands.build", "tfgraph.exporters.torch.folder")
    assert graph.number_of_edges() > 100
    cycles = _describe_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_finder_sees_deferred_and_aliased_imports(tmp_path: Path) -> None:
    """The check above on a made-up package with a cycle through a function-level import
    and the ``exporters`` alias: it must be found (else the check could pass vacuously)."""
    (tmp_path / "a.py").write_text("from tfgraph import b\n")
    (tmp_path / "b.py").write_text("def f():\n    import exporters.c\n")
    (tmp_path / "c.py").write_text("from tfgraph.a import thing\n")
    (tmp_path / "d.py").write_text("import tfgraph.a\n")  # into the cycle, not part of it
    files = {"tfgraph.a": tmp_path / "a.py", "tfgraph.b": tmp_path / "b.py",
             "tfgraph.exporters.c": tmp_path / "c.py", "tfgraph.d": tmp_path / "d.py"}
    cycles = _describe_cycles(import_graph(files))
    assert len(cycles) == 1
    assert cycles[0].splitlines()[0] == \
        "tfgraph.a -> tfgraph.b -> tfgraph.exporters.c -> tfgraph.a"
    assert "b.py:2: import exporters.c" in cycles[0]


def test_the_core_never_imports_a_back_end() -> None:
    """README.md, "How it works": back ends read the graph; the core knows none of them. Only the CLI's
    command modules (which run a back end on the user's request) may import
    tfgraph.exporters. Catches, e.g., a cost pass reaching into the torch module."""
    graph = import_graph(_module_files())
    wrong = [f"{a} -> {b}: {graph.edges[a, b]['lines']}" for a, b in graph.edges
             if a.startswith("tfgraph.") and not a.startswith(("tfgraph.exporters",
                                                                "tfgraph.commands."))
             and b.startswith("tfgraph.exporters")]
    assert not wrong, wrong


def test_the_cycle_finder_follows_lazy_import_tables(tmp_path: Path) -> None:
    """A module named in a string (``_LAZY = {"f": "tfgraph.exporters.c"}`` imported by
    ``importlib.import_module(_LAZY[name])``) is an import edge: tfgraph/__init__.py's lazy
    ``generate`` must not hide a core -> back end import."""
    (tmp_path / "a.py").write_text(
        "import importlib\n_LAZY = {'f': 'tfgraph.exporters.c'}\n"
        "def __getattr__(name):\n    return importlib.import_module(_LAZY[name])\n")
    (tmp_path / "c.py").write_text("x = 1\n")
    files = {"tfgraph.a": tmp_path / "a.py", "tfgraph.exporters.c": tmp_path / "c.py"}
    assert import_graph(files).has_edge("tfgraph.a", "tfgraph.exporters.c")
    graph = import_graph(_module_files())
    assert graph.has_edge("tfgraph.exporters", "tfgraph.exporters.torch.module")
    assert graph.has_edge("tfgraph", "tfgraph.commands.generate_api")


# What a back end must not read: the spec, or the core layers that lower one (issue 23).
SPEC_READERS = re.compile(r"graph\.spec\b|tfgraph\.compile\(|tfgraph\.graph\.lower\b"
                          r"|tfgraph\.spec\b|tfgraph\.compiler\b")


def test_back_ends_read_the_graph_only() -> None:
    """README.md, "How it works": every fact a back end needs (cache layout, which graphs a
    model decodes with, lengths rule, description, the spec's text) is on the graph
    (``graph.info``, set by lowering); no file of exporters/ names the spec, the lowering or
    the compiler, nor compiles a spec (``re.compile(`` and ``torch.compile(`` are fine)."""
    hits = []
    for path in sorted((ROOT / "exporters").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if SPEC_READERS.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "\n".join(hits)
    assert SPEC_READERS.search("x = graph.spec.name") and SPEC_READERS.search(
        "from tfgraph.graph.lower import cache_parts") and not SPEC_READERS.search(
        "re.compile(r'x'); torch.compile(m)")


def test_the_ir_knows_nothing_above_it() -> None:
    """tfgraph.compiler's layering: the IR (and the plan built on it) import neither the
    lowering, the passes, the report nor the compiler, even indirectly."""
    import networkx as nx

    graph = import_graph(_module_files())
    above = {"tfgraph.graph.lower", "tfgraph.passes.cost", "tfgraph.passes.report", "tfgraph.passes.figures",
             "tfgraph.passes.formulas", "tfgraph.compiler", "tfgraph.passes.compare", "tfgraph"}
    for low in ("tfgraph.graph.tensor", "tfgraph.graph.ops", "tfgraph.graph.ir", "tfgraph.passes.liveness"):
        reached = nx.descendants(graph, low)
        assert not reached & above, (low, sorted(reached & above))
